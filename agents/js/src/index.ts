export { Command, decode, encode, DEFAULT_LIMITS, MAX_COMMAND_ID } from "./codec.js";
export type { HeaderInput, HeaderValue, Limits } from "./codec.js";
export { AsbpError, ConnectionLost, FaultCode, FaultError, ProtocolError, TimeoutError } from "./errors.js";
