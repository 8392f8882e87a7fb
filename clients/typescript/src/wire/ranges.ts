/**
 * The two ack range lists (profile §1). ACK_RELIABLE: gap, run, gap, run, ... counted from
 * the receiver's lowest not-yet-acked reliable number; an even, non-zero count; only the
 * first gap may be 0. ACK_NACK_UNRELIABLE: ack-run, nack-run, ... counted from the ack/nack
 * cursor; at least one item, all non-zero except a leading 0 followed by more.
 */
import { LocalProtocolError, RemoteProtocolError } from "./errors.js";

type ErrorClass = new (message: string) => Error;

export function checkAckReliable(ranges: readonly number[], error: ErrorClass = RemoteProtocolError): void {
  if (ranges.length === 0 || ranges.length % 2)
    throw new error(`ACK_RELIABLE needs an even, non-zero number of varints, got ${ranges.length}`);
  for (let i = 1; i < ranges.length; i++)
    if (ranges[i] === 0) throw new error("ACK_RELIABLE: only the first gap may be zero");
}

export function checkAckNack(ranges: readonly number[], error: ErrorClass = RemoteProtocolError): void {
  if (ranges.length === 0) throw new error("ACK_NACK_UNRELIABLE needs at least one varint");
  ranges.forEach((value, i) => {
    if (value === 0 && (i !== 0 || ranges.length === 1))
      throw new error("ACK_NACK_UNRELIABLE: only a leading ack run (followed by more) may be zero");
  });
}

/** Gap/run list acking `numbers` (each >= `base`, distinct) relative to `base`. */
export function encodeAckReliable(base: number, numbers: readonly number[]): number[] {
  const nums = [...numbers].sort((a, b) => a - b);
  if (nums.length === 0) throw new LocalProtocolError("ACK_RELIABLE must ack at least one number");
  const out: number[] = [];
  let cursor = base;
  let i = 0;
  while (i < nums.length) {
    const start = nums[i]!;
    if (start < cursor) throw new LocalProtocolError(`cannot ack ${start}: below base ${base} or repeated`);
    let j = i;
    while (j + 1 < nums.length && nums[j + 1] === nums[j]! + 1) j++;
    out.push(start - cursor, nums[j]! + 1 - start);
    cursor = nums[j]! + 1;
    i = j + 1;
  }
  return out;
}

/** Half-open [start, stop) runs acked by an ACK_RELIABLE read against `base`. */
export function ackReliableRuns(base: number, ranges: readonly number[]): Array<[number, number]> {
  const runs: Array<[number, number]> = [];
  let cursor = base;
  for (let i = 0; i < ranges.length; i += 2) {
    const start = cursor + ranges[i]!;
    cursor = start + ranges[i + 1]!;
    runs.push([start, cursor]);
  }
  return runs;
}

/** Run list deciding [cursor, upto): the sorted, disjoint, non-adjacent `acked` ranges are
 * acked, the rest nacked. Its size depends on the ranges, never on the numbers decided. */
export function encodeAckNackRuns(
  cursor: number,
  upto: number,
  acked: ReadonlyArray<readonly [number, number]>,
): number[] {
  if (upto <= cursor) throw new LocalProtocolError("ACK_NACK_UNRELIABLE must decide at least one number");
  const out: number[] = [];
  let pos = cursor;
  for (const [start, stop] of acked) {
    if (start < pos || stop <= start || stop > upto)
      throw new LocalProtocolError(`acked range [${start}, ${stop}) is out of order or bounds`);
    if (start > pos) {
      if (out.length === 0) out.push(0);
      out.push(start - pos);
    } else if (out.length) {
      throw new LocalProtocolError("adjacent acked ranges must be merged");
    }
    out.push(stop - start);
    pos = stop;
  }
  if (pos < upto) {
    if (out.length === 0) out.push(0);
    out.push(upto - pos);
  }
  return out;
}

/** [start, stop, acked] runs of an ACK_NACK_UNRELIABLE read from `cursor`. */
export function ackNackRuns(cursor: number, ranges: readonly number[]): Array<[number, number, boolean]> {
  const runs: Array<[number, number, boolean]> = [];
  let acked = true;
  for (const length of ranges) {
    if (length) runs.push([cursor, cursor + length, acked]);
    cursor += length;
    acked = !acked;
  }
  return runs;
}
