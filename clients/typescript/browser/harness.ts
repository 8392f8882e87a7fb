/** The client library on window.aqueduct, for tests and benchmarks that drive a browser. */
import * as arrow from "apache-arrow";
import * as aqueduct from "../src/index.js";

declare global {
  interface Window {
    aqueduct: typeof aqueduct & { arrow: typeof arrow };
    aqueductReady: boolean;
  }
}
window.aqueduct = { ...aqueduct, arrow };
window.aqueductReady = true;
