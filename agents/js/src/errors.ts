/**
 * The client's errors, each with the fault code of Sapo-Broker's table that
 * asbp/faults.py holds (1xxx format, 2xxx messaging and routing, 3xxx security).
 * One `catch (e) { if (e instanceof AsbpError) e.code }` reads any of them.
 */

/** Fault codes the codec raises, as in asbp/faults.py. */
export const FaultCode = {
  INVALID_MESSAGE_SIZE: 1101,
  HEADER_TOO_LARGE: 1104,
  TOO_MANY_KEYS: 1105,
  TOO_MANY_LIST_ITEMS: 1106,
  INVALID_MESSAGE_FORMAT: 1201,
  INVALID_HEADER_VALUE: 1203,
  NO_RESPONDENT: 2101,
  RESPONDENT_TIMEOUT: 2103,
  AUTHENTICATION_FAILED: 3101,
  ACCESS_DENIED: 3201,
} as const;

/** The root: every error this package raises on purpose. */
export class AsbpError extends Error {
  readonly code: number;
  constructor(code: number, message: string) {
    super(`${code}: ${message}`);
    this.name = new.target.name;
    this.code = code;
  }
}

/** A frame or Command that breaks the grammar or a reserved key's rule. */
export class ProtocolError extends AsbpError {
  /** Where in the frame the fault was found, in bytes; undefined when not tied to one. */
  readonly offset: number | undefined;
  constructor(code: number, message: string, offset?: number) {
    super(code, offset === undefined ? message : `${message} at byte ${offset}`);
    this.offset = offset;
  }
}

/** A fault the broker (or an agent through it) answered with: `code` as sent. */
export class FaultError extends AsbpError {
  /** The name of the Command the fault is about, when the broker said. */
  readonly cause: string | undefined;
  constructor(code: number, message: string, cause?: string) {
    super(code, message);
    this.cause = cause;
  }
}

/** No answer within the request's timeout (the client's own, not the broker's 2103). */
export class TimeoutError extends AsbpError {
  constructor(message: string) {
    super(FaultCode.RESPONDENT_TIMEOUT, message);
  }
}

/** The connection closed with the request in flight, or the client was closed. */
export class ConnectionLost extends AsbpError {
  constructor(message: string) {
    // 2107, as every error of the Python SDK (agents/errors.py) that no peer sent.
    super(2107, message);
  }
}
