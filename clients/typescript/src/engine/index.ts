export { Connection } from "./connection.js";
export type { NewChannel } from "./channels.js";
export { DEFAULT_CONFIG, DEFAULT_WINDOW, type EngineConfig, engineConfig } from "./config.js";
export { type Command, type Event, Terminal, terminalError } from "./events.js";
export { ENTRY_WINDOW_HEADER, FLOW_HEADER, parseWindow, type ServerHeaders } from "./handshake.js";
export type { Mode, QueuePolicy } from "./sender.js";
export { TRANSITIONS } from "./receiver.js";
