/** Every timer and limit of the engine (profile §6); times in seconds. */
import { DEFAULT_LIMITS, DEFAULT_VERSION, type Bytes, type WireLimits } from "../wire/index.js";

export interface EngineConfig {
  /** Reliable acks go out at most this long after a message arrives (<= 1 s). */
  readonly ackDelay: number;
  readonly sentUnreliableDelay: number;
  readonly unreliableDeadlineMin: number;
  readonly unreliableDeadlineMax: number;
  /** At most one FORGET_CHANNEL per channel per interval (G20). */
  readonly forgetInterval: number;
  /** The peer's CONNECTION_HEADERS must arrive within this time (close code 4). */
  readonly handshakeTimeout: number;
  readonly limits: WireLimits;
  readonly maxChannels: number;
  readonly maxPendingChannels: number;
  readonly maxPendingBytes: number;
  /** G31: how far a message number may run ahead of the lowest undecided one. */
  readonly maxMessageGap: number;
  readonly maxEarlyBytes: number;
  readonly requireFlowControl: boolean;
  /** Per-channel receive window we advertise; null: no flow control. */
  readonly flowWindow: number | null;
  /** A server's smaller window on the entrypoint (profile §4 item 9); null: none. */
  readonly entryWindow: number | null;
  readonly dequeuedDelay: number;
  readonly version: Bytes;
  readonly maxDatagramSize: number;
}

export const DEFAULT_WINDOW = 16 * 1024 * 1024;

export const DEFAULT_CONFIG: EngineConfig = {
  ackDelay: 0.05,
  sentUnreliableDelay: 0.05,
  unreliableDeadlineMin: 0.1,
  unreliableDeadlineMax: 1.0,
  forgetInterval: 1.0,
  handshakeTimeout: 10.0,
  limits: DEFAULT_LIMITS,
  maxChannels: 10_000,
  maxPendingChannels: 4096,
  maxPendingBytes: 256 * 1024 * 1024,
  maxMessageGap: 1 << 20,
  maxEarlyBytes: 16 * 1024 * 1024,
  requireFlowControl: false,
  flowWindow: DEFAULT_WINDOW,
  entryWindow: null,
  dequeuedDelay: 0.02,
  version: DEFAULT_VERSION,
  maxDatagramSize: 1200,
};

export function engineConfig(overrides: Partial<EngineConfig> = {}): EngineConfig {
  return { ...DEFAULT_CONFIG, ...overrides };
}
