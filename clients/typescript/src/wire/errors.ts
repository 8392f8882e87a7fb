/**
 * The error tree (profile §1 "Close codes", §3 "What the application sees"), shaped like the
 * Python package's: protocol errors carry the close code the connection ends with, channel
 * errors are the one terminal state each handle reaches.
 */

/** Close codes of the profile (G24); 6 is the TCP multiplexer's idle timeout (§7). */
export const CloseCode = {
  NO_ERROR: 0,
  PROTOCOL_VIOLATION: 1,
  UNSUPPORTED_VERSION: 2,
  LIMIT_VIOLATION: 3,
  HANDSHAKE_TIMEOUT: 4,
  INTERNAL: 5,
  IDLE_TIMEOUT: 6,
} as const;
export type CloseCode = (typeof CloseCode)[keyof typeof CloseCode];

/** Base class of every error this package raises. */
export class AqueductError extends Error {
  override name = "AqueductError";
}

/** The peer broke the protocol: the connection closes with `code`. */
export class RemoteProtocolError extends AqueductError {
  override name = "RemoteProtocolError";
  constructor(
    message: string,
    readonly code: number = CloseCode.PROTOCOL_VIOLATION,
  ) {
    super(message);
  }
}

/** Our own caller misused the API; nothing changed. */
export class LocalProtocolError extends AqueductError {
  override name = "LocalProtocolError";
}

/** Base class of the terminal states of a channel handle. */
export class ChannelError extends AqueductError {
  override name = "ChannelError";
}
/** The peer's application closed the receiver of this sender. */
export class ReceiverDropped extends ChannelError {
  override name = "ReceiverDropped";
}
/** The peer cancelled the sender of this receiver: the rest of its data will not come. */
export class ChannelCancelled extends ChannelError {
  override name = "ChannelCancelled";
}
/** The message that carried this channel (or an ancestor's) was lost (§3). */
export class LostInTransit extends ChannelError {
  override name = "LostInTransit";
}
/** The connection ended before the channel did. */
export class ConnectionLost extends ChannelError {
  override name = "ConnectionLost";
}
/** This handle was already finished, cancelled or closed by our own application. */
export class ChannelClosed extends ChannelError {
  override name = "ChannelClosed";
}
/** The sender finished and every message was received: not a failure. */
export class EndOfChannel extends AqueductError {
  override name = "EndOfChannel";
}
/** A bounded sender queue is full; wait for room. */
export class WouldBlock extends AqueductError {
  override name = "WouldBlock";
}
