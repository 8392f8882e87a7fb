/**
 * Payload codecs (profile §4 "Codec"): CBOR by default, where a channel end inside a value
 * travels as an attachment (CBOR tag 44045 holding its index in the message's attachment
 * list), and `raw` for bytes the application encoded itself (Arrow IPC).
 */
import { type TagDecoder, decode, encode } from "cbor2";
import { RemoteProtocolError, utf8 } from "../wire/index.js";

export const CODEC_HEADER = utf8("aqueduct-codec-3e7a91");
export const HANDLE_TAG = 44045;
export type CodecName = "cbor" | "raw";

/** Something that travels as an attachment inside a CBOR value (a channel end). */
export interface Attachable {
  readonly attachable: true;
}

let attachHook: ((handle: Attachable) => number) | null = null;

/** The base of channel ends: cbor2 calls toCBOR while it encodes a value. */
export abstract class Handle implements Attachable {
  readonly attachable = true as const;
  toCBOR(): [number, number] {
    if (attachHook === null) throw new Error("a channel end can only travel inside a message sent on a channel");
    return [HANDLE_TAG, attachHook(this)];
  }
}

/** CBOR bytes of `value`; every channel end in it is handed to `attach`. */
export function encodeCbor(value: unknown, attach: (handle: Attachable) => number): Uint8Array {
  const previous = attachHook;
  attachHook = attach;
  try {
    return encode(value);
  } finally {
    attachHook = previous;
  }
}

/** The value of CBOR `payload`; tag 44045 becomes `detach(index)`. */
export function decodeCbor(payload: Uint8Array, detach: (index: number) => unknown): unknown {
  try {
    return decode(payload, {
      tags: new Map<number, TagDecoder>([[HANDLE_TAG, (tag) => detach(Number(tag.contents))]]),
    });
  } catch (err) {
    if (err instanceof RemoteProtocolError) throw err;
    throw new RemoteProtocolError(`message payload is not valid CBOR: ${String(err)}`);
  }
}
