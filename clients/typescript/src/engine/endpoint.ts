/** The application-facing object of a channel (G18, G22): the receive queue and the one
 * terminal state. Apart from the state machine because it must outlive it: a channel the
 * peer created may receive all its data and close before the message attaching it arrives. */
import type { Headers, Message } from "../wire/index.js";
import type { Terminal } from "./events.js";

export interface Queued {
  readonly message: Message;
  readonly cost: number;
}

export class Endpoint {
  /** The application holds the handle (it took the message that carried it, or made it). */
  held: boolean;
  /** The application is done with the handle; freed once its machine is gone too. */
  appDone = false;
  headers: Headers;
  terminal: Terminal | null = null;
  detail = "";
  queue: Queued[] = [];
  queueHead = 0;
  /** Bytes in the queue (costs). */
  buffered = 0;

  constructor(
    readonly chanid: number,
    /** Our side holds the sender half. */
    readonly isSender: boolean,
    /** False only for a peer-created channel whose attaching MESSAGE has not arrived. */
    public attached: boolean,
    held = false,
    headers: Headers = [],
  ) {
    this.held = held;
    this.headers = headers;
  }

  get queued(): number {
    return this.queue.length - this.queueHead;
  }

  /** Take the oldest queued message (an index, so a long queue is not shifted each time). */
  shift(): Queued | undefined {
    if (this.queueHead >= this.queue.length) return undefined;
    const item = this.queue[this.queueHead++]!;
    if (this.queueHead > 64 && this.queueHead * 2 > this.queue.length) {
      this.queue = this.queue.slice(this.queueHead);
      this.queueHead = 0;
    }
    return item;
  }

  items(): Queued[] {
    return this.queue.slice(this.queueHead);
  }

  clearQueue(): void {
    this.queue = [];
    this.queueHead = 0;
  }

  /** Record the terminal state; the first one wins (§3). */
  setTerminal(terminal: Terminal, detail = ""): boolean {
    if (this.terminal !== null) return false;
    this.terminal = terminal;
    this.detail = detail;
    return true;
  }
}
