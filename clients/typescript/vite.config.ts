/** Builds the console (console/index.html and what it imports) into dist/console: static
 * files that `aqueduct serve --console` serves, with relative paths so any prefix works.
 * `vite build --mode harness` builds browser/index.html into dist/harness instead: a
 * blank page that puts the client library on `window.aqueduct` for the browser tests and
 * the benchmark to drive. */
import { fileURLToPath } from "node:url";
import { defineConfig } from "vite";

export default defineConfig(({ mode }) => {
  const harness = mode === "harness";
  const here = (p: string) => fileURLToPath(new URL(p, import.meta.url));
  return {
    root: here(harness ? "./browser" : "./console"),
    base: "./",
    logLevel: "warn",
    build: {
      outDir: here(harness ? "./dist/harness" : "./dist/console"),
      emptyOutDir: true,
      target: "es2022",
      chunkSizeWarningLimit: 1024,
      reportCompressedSize: false,
    },
  };
});
