/**
 * Lost-in-transit detection (profile §3). A channel X attached to message M sent on P is
 * accessible iff M was acked and P is accessible, lost iff M was nacked or P is lost. Only X's
 * creator sees M's fate, so it keeps a node per channel it created, apart from the state
 * machine: a sender may finish and go while still pending, and if it then turns out lost,
 * the channels attached to its acked messages are lost too. The cascade is a worklist.
 */

/** "u" + number for the unreliable space, "r" + number for the reliable one. */
export type MsgKey = string;
export const msgKey = (unreliable: boolean, num: number): MsgKey => (unreliable ? "u" : "r") + num;

export class LineageNode {
  routeToSent = false;
  hasSm = true;
  /** Attachments of our numbered messages on this channel, not yet acked or nacked. */
  unacked = new Map<MsgKey, number[]>();
  /** Attachments of acked messages, held while this channel is still pending. */
  ackedPending: number[] = [];
  constructor(
    readonly chanid: number,
    readonly keptSender: boolean,
    public accessible: boolean,
  ) {}
}

export class Lineage {
  readonly nodes = new Map<number, LineageNode>();
  constructor(private readonly onLost: (chanid: number, node: LineageNode) => number[]) {}

  add(chanid: number, keptSender: boolean, accessible: boolean): LineageNode {
    const node = new LineageNode(chanid, keptSender, accessible);
    this.nodes.set(chanid, node);
    return node;
  }

  numbered(parent: number, key: MsgKey, children: number[]): void {
    if (children.length) this.nodes.get(parent)?.unacked.set(key, children);
  }

  ack(parent: number, key: MsgKey): void {
    const node = this.nodes.get(parent);
    if (!node) return;
    const children = node.unacked.get(key);
    if (!children) return;
    node.unacked.delete(key);
    if (node.accessible) for (const child of children) this.markAccessible(child);
    else node.ackedPending.push(...children);
  }

  nack(parent: number, key: MsgKey): void {
    const node = this.nodes.get(parent);
    if (!node) return;
    const children = node.unacked.get(key);
    if (!children) return;
    node.unacked.delete(key);
    this.loseAll(children);
  }

  markAccessible(chanid: number): void {
    const work = [chanid];
    while (work.length) {
      const node = this.nodes.get(work.pop()!);
      if (!node || node.accessible) continue;
      node.accessible = true;
      work.push(...node.ackedPending);
      node.ackedPending = [];
      this.maybeFree(node);
    }
  }

  loseAll(chanids: readonly number[]): void {
    const work = [...chanids];
    while (work.length) {
      const chanid = work.pop()!;
      const node = this.nodes.get(chanid);
      if (!node || node.accessible) continue; // resolved already: accessible is final
      this.nodes.delete(chanid);
      work.push(...this.onLost(chanid, node));
      if (node.keptSender) {
        for (const children of node.unacked.values()) work.push(...children);
        work.push(...node.ackedPending);
      }
      node.unacked = new Map();
      node.ackedPending = [];
    }
  }

  smGone(chanid: number): void {
    const node = this.nodes.get(chanid);
    if (node) {
      node.hasSm = false;
      this.maybeFree(node);
    }
  }

  maybeFree(node: LineageNode): void {
    if (node.accessible && !node.hasSm && node.unacked.size === 0) this.nodes.delete(node.chanid);
  }
}
