export { Command, decode, encode, DEFAULT_LIMITS, MAX_COMMAND_ID } from "./codec.js";
export type { HeaderInput, HeaderValue, Limits } from "./codec.js";
export { AsbpError, ConnectionLost, FaultCode, FaultError, ProtocolError, TimeoutError } from "./errors.js";
export { Client, MAX_QUEUED, Subject, Subscription, faultOf } from "./client.js";
export type {
  Body,
  ChannelEvent,
  ClientOptions,
  DestinationType,
  GapEvent,
  RequestOptions,
  State,
  TransportKind,
} from "./client.js";
export { MAX_RETRY_AFTER, parseMultipart, retryAfterMs } from "./transports.js";
export type { FetchLike, WebSocketLike } from "./transports.js";
