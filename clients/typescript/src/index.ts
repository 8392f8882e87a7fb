/** Aqueduct in the browser: the public surface of the package. */
export * as wire from "./wire/index.js";
export { Connection as Engine } from "./engine/connection.js";
export { AqueductConnection, Receiver, Sender, channel, oneshot } from "./api/connection.js";
export { dial, forgetWinners, type DialOptions, type Endpoints, type TransportChoice } from "./transport/dial.js";
export { DatasetClient, type ClientOptions, type DatasetInfo, type Plan, type VersionInfo } from "./dataset/client.js";
export { DatasetError } from "./dataset/errors.js";
