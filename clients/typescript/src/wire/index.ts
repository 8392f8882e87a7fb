export * from "./errors.js";
export * from "./primitives.js";
export * from "./chanid.js";
export * from "./ranges.js";
export * from "./frames.js";
export * from "./parser.js";
