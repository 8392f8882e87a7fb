"""Test helpers for Aqueduct and for code built on it. Import the submodule you need:

- :mod:`aqueduct_core.testing.simnet`: :class:`~aqueduct_core.testing.simnet.SimNetwork`, a
  client and a server engine joined by a simulated QUIC network in virtual time, with seeded
  datagram loss, duplication, stream reordering and random chunking;
- :mod:`aqueduct_core.testing.scripted`: :class:`~aqueduct_core.testing.scripted.ScriptedPeer`,
  one real engine under test whose peer is played by hand with raw frames (chosen stream ids,
  chunks, FIN, resets, datagrams), with everything the engine wrote decoded per stream
  (:class:`~aqueduct_core.testing.scripted.WireLog`, also usable on a ``SimNetwork`` through
  :class:`~aqueduct_core.testing.scripted.NetworkLog`);
- :mod:`aqueduct_core.testing.memory`: two application-level connections joined in memory;
- :mod:`aqueduct_core.testing.strategies`: hypothesis strategies for wire values and frames.
  Only this one needs ``hypothesis``; importing this package does not import it.
"""
