"""The Aqueduct dataset service: named datasets stored as Delta Lake tables, served over Aqueduct."""
