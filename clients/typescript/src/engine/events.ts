/** What the engine produces: transport commands (for the driver) and application events. */
import {
  type Bytes,
  ChannelCancelled,
  ChannelClosed,
  type ChannelError,
  ConnectionLost,
  type Headers,
  LostInTransit,
  ReceiverDropped,
} from "../wire/index.js";

/** Write `data` to unidirectional stream `streamId` (opened on first use), then end it if
 * `fin`. Ids follow QUIC numbering: 2, 6, 10, ... for a client, 3, 7, 11, ... for a server. */
export interface WriteStream {
  readonly kind: "write";
  readonly streamId: number;
  readonly data: Bytes;
  readonly fin: boolean;
}
export interface ResetStream {
  readonly kind: "reset";
  readonly streamId: number;
}
export interface SendDatagram {
  readonly kind: "datagram";
  readonly data: Bytes;
}
export interface CloseConnection {
  readonly kind: "close";
  readonly code: number;
  readonly reason: string;
}
export type Command = WriteStream | ResetStream | SendDatagram | CloseConnection;

/** The one terminal state each channel handle reaches (profile §3). */
export const Terminal = {
  FINISHED: "finished",
  RECEIVER_DROPPED: "receiver dropped",
  CANCELLED: "cancelled",
  CLOSED: "closed",
  LOST_IN_TRANSIT: "lost in transit",
  CONNECTION_LOST: "connection lost",
} as const;
export type Terminal = (typeof Terminal)[keyof typeof Terminal];

export function terminalError(terminal: Terminal, detail = ""): ChannelError | null {
  const text = `${terminal}${detail ? `: ${detail}` : ""}`;
  switch (terminal) {
    case Terminal.RECEIVER_DROPPED:
      return new ReceiverDropped(text);
    case Terminal.CANCELLED:
      return new ChannelCancelled(text);
    case Terminal.CLOSED:
      return new ChannelClosed(text);
    case Terminal.LOST_IN_TRANSIT:
      return new LostInTransit(text);
    case Terminal.CONNECTION_LOST:
      return new ConnectionLost(text);
    default:
      return null;
  }
}

export type Event =
  | { readonly kind: "headers"; readonly headers: Headers }
  | { readonly kind: "message"; readonly chanid: number }
  | { readonly kind: "senderReady"; readonly chanid: number }
  | { readonly kind: "terminated"; readonly chanid: number; readonly terminal: Terminal }
  | {
      readonly kind: "connectionTerminated";
      readonly code: number;
      readonly reason: string;
      readonly byPeer: boolean;
      readonly error: Error | null;
    };
