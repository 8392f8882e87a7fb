/**
 * Channel ids (profile §1): bit 0 CREATOR (0: the client), bit 1 SENDER (0: the client holds
 * the sender), bit 2 ONESHOT, bits 3 and up the index, counted per (creator, sender, oneshot)
 * space. The entrypoint is chanid 0, so the client/client/multishot space starts at 1.
 */
export const ENTRYPOINT = 0;

/** Which end of the connection; the value is the bit a chanid uses for that side. */
export const Side = { CLIENT: 0, SERVER: 1 } as const;
export type Side = (typeof Side)[keyof typeof Side];

// Chanids can exceed 2^31, so no bitwise operators on the whole value.
export const creatorOf = (chanid: number): Side => (chanid % 2) as Side;
export const senderOf = (chanid: number): Side => (Math.floor(chanid / 2) % 2) as Side;
export const isOneshot = (chanid: number): boolean => Math.floor(chanid / 4) % 2 === 1;
export const indexOf = (chanid: number): number => Math.floor(chanid / 8);
export const spaceOf = (chanid: number): number => chanid % 8;

export function makeChanid(creator: Side, sender: Side, oneshot: boolean, index: number): number {
  return creator + 2 * sender + (oneshot ? 4 : 0) + 8 * index;
}

export function describeChanid(chanid: number): string {
  if (chanid === ENTRYPOINT) return "chan#0(entrypoint)";
  const who = (s: Side) => (s === Side.CLIENT ? "client" : "server");
  const kind = isOneshot(chanid) ? "oneshot" : "multishot";
  return `chan#${chanid}(${who(creatorOf(chanid))}-created, ${who(senderOf(chanid))}-sends, ${kind}, index ${indexOf(chanid)})`;
}
