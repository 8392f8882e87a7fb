import { defineConfig } from "vitest/config";

// One worker, one module graph: the suite is pure (no globals, no I/O) and small, and a
// worker per file costs more CPU than the tests themselves (make test runs it on 2 cores).
export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    environment: "node",
    testTimeout: 20_000,
    pool: "threads",
    isolate: false,
    fileParallelism: false,
  },
});
