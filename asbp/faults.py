"""Fault codes: Sapo-Broker's fault table, plus our documented extensions.

Sapo-Broker 3 ("Error handling", ../shared/reference/sapo-broker-3.txt)
groups its codes by thousands: 1xxx transport and format, 2xxx messaging,
3xxx security. Where ASBP needs a distinction Sapo does not draw, we take a
free code inside the matching block and mark it as an extension, so a client
that only knows Sapo's table can still read the block from the first digit.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["FaultCode"]


class FaultCode(IntEnum):
    """Every fault the gateway can report, with Sapo-Broker's numbering."""

    # 11xx: message format faults (Sapo).
    #: The frame is larger than the configured frame-size limit.
    INVALID_MESSAGE_SIZE = 1101
    #: Sapo: unknown encoding protocol.
    UNKNOWN_ENCODING_PROTOCOL = 1102
    #: Sapo: unknown encoding version.
    UNKNOWN_ENCODING_VERSION = 1103
    #: Extension: the header is longer than the header-size limit.
    HEADER_TOO_LARGE = 1104
    #: Extension: the header holds more keys than the key limit.
    TOO_MANY_KEYS = 1105
    #: Extension: a bracketed list holds more items than the list limit.
    TOO_MANY_LIST_ITEMS = 1106

    # 12xx: payload encoding faults (Sapo).
    #: The header does not follow the grammar of draft section 1.3.4.
    INVALID_MESSAGE_FORMAT = 1201
    #: Sapo: a message of a type the receiver does not take.
    UNEXPECTED_MESSAGE_TYPE = 1202
    #: Extension: a reserved key holds a value its definition forbids.
    INVALID_HEADER_VALUE = 1203

    # 20xx: messaging faults (Sapo).
    #: Sapo: invalid destination name.
    INVALID_DESTINATION_NAME = 2001
    #: Sapo: invalid destination type.
    INVALID_DESTINATION_TYPE = 2002
    #: Sapo: maximum number of queues reached.
    MAX_QUEUES_REACHED = 2003
    #: Sapo: maximum distinct subscriptions reached.
    MAX_SUBSCRIPTIONS_REACHED = 2004
    #: Extension: the topic and queue engine (Redis) cannot be reached.
    ENGINE_UNAVAILABLE = 2005
    #: Extension: the queue already holds its maximum number of messages.
    QUEUE_FULL = 2006

    # 21xx: routing faults (extensions).
    #: Extension: no Command-Respondent serves this Command-Name.
    NO_RESPONDENT = 2101
    #: Extension: the Application-Agent left with this Command in flight.
    RESPONDENT_LEFT = 2102
    #: Extension: the Respondent did not answer within the timeout.
    RESPONDENT_TIMEOUT = 2103
    #: Extension: no Channel with this Channel-Identifier at this broker.
    UNKNOWN_CHANNEL = 2104
    #: Extension: the reader fell behind and its outbound buffer filled up.
    SLOW_CONSUMER = 2105
    #: Extension: too many Commands awaiting an answer on this Channel.
    TOO_MANY_IN_FLIGHT = 2106
    #: Extension: the Command-Respondent failed while handling the Command.
    RESPONDENT_FAILED = 2107
    #: Extension: one client address holds or opens too many Channels.
    TOO_MANY_CHANNELS = 2108
    #: Extension: the publisher's destinations are full; it is held back (flow control).
    DESTINATIONS_BUSY = 2109
    #: Extension: no Channel to resume: unknown, expired, forgotten, or not this secret's.
    RESUME_REFUSED = 2110
    #: Extension: Commands for the resumed Channel passed the log's retention (a gap).
    RESUME_GAP = 2111
    #: Extension: the Channel was resumed by another connection, which now holds it.
    CHANNEL_RESUMED = 2112
    #: Extension: this broker does not resume Channels (resume off, or the bus unreachable).
    RESUME_UNAVAILABLE = 2113
    #: Extension: the broker stops (a rolling restart); resume the Channel at another one.
    BROKER_RESTARTING = 2114
    #: Extension: the broker is serving as many handshakes as it may; retry later (HTTP 503).
    BROKER_BUSY = 2115

    # 22xx: Courses, links between buses (extension; docs/courses.md).
    #: Extension: no Subject at this bus holds the Conversation-Address in ``r``.
    UNKNOWN_ADDRESS = 2201
    #: Extension: no Course reaches the domain of an address in ``r``.
    NO_COURSE = 2202
    #: Extension: a Course from a domain this bus does not list.
    COURSE_UNLISTED = 2203
    #: Extension: a Course credential that does not verify for the domain it claims.
    COURSE_CREDENTIAL_REFUSED = 2204
    #: Extension: a Course credential already used once.
    COURSE_REPLAYED = 2205
    #: Extension: a Course offered without TLS.
    COURSE_PLAIN_TEXT = 2206
    #: Extension: the Command crossed as many Courses as allowed.
    HOP_LIMIT = 2207
    #: Extension: the Command came back to a bus it already crossed (a loop).
    COURSE_LOOP = 2208
    #: Extension: the queue for a domain holds as many Commands or bytes as allowed.
    COURSE_QUEUE_FULL = 2209
    #: Extension: the Command waited for its Course longer than allowed.
    COURSE_EXPIRED = 2210
    #: Extension: the Course's policy does not let this Command cross.
    COURSE_NOT_PERMITTED = 2211
    #: Extension: ``r`` needs an authenticated Subject with a Conversation-Address.
    NO_ADDRESS = 2212

    # 31xx: authentication faults (Sapo).
    #: Sapo: authentication failed.
    AUTHENTICATION_FAILED = 3101
    #: Sapo: unknown authentication type.
    UNKNOWN_AUTHENTICATION_TYPE = 3102
    #: Sapo: invalid authentication channel type (TLS was not used).
    INVALID_AUTHENTICATION_CHANNEL_TYPE = 3103

    # 32xx: authorization faults (Sapo).
    #: Sapo: access denied.
    ACCESS_DENIED = 3201

    @property
    def description(self) -> str:
        """A short human-readable description, as in Sapo's table."""
        return _DESCRIPTIONS[self]


_DESCRIPTIONS: dict[FaultCode, str] = {
    FaultCode.INVALID_MESSAGE_SIZE: "Invalid message size",
    FaultCode.UNKNOWN_ENCODING_PROTOCOL: "Unknown encoding protocol",
    FaultCode.UNKNOWN_ENCODING_VERSION: "Unknown encoding version",
    FaultCode.HEADER_TOO_LARGE: "Header too large",
    FaultCode.TOO_MANY_KEYS: "Too many header keys",
    FaultCode.TOO_MANY_LIST_ITEMS: "Too many list items",
    FaultCode.INVALID_MESSAGE_FORMAT: "Invalid message format",
    FaultCode.UNEXPECTED_MESSAGE_TYPE: "Unexpected message type",
    FaultCode.INVALID_HEADER_VALUE: "Invalid header value",
    FaultCode.INVALID_DESTINATION_NAME: "Invalid destination name",
    FaultCode.INVALID_DESTINATION_TYPE: "Invalid destination type",
    FaultCode.MAX_QUEUES_REACHED: "Maximum number of queues reached",
    FaultCode.MAX_SUBSCRIPTIONS_REACHED: "Maximum distinct subscriptions reached",
    FaultCode.ENGINE_UNAVAILABLE: "Engine unavailable",
    FaultCode.QUEUE_FULL: "Queue full",
    FaultCode.NO_RESPONDENT: "No Command-Respondent",
    FaultCode.RESPONDENT_LEFT: "Command-Respondent left",
    FaultCode.RESPONDENT_TIMEOUT: "Command-Respondent timed out",
    FaultCode.UNKNOWN_CHANNEL: "Unknown channel",
    FaultCode.SLOW_CONSUMER: "Slow consumer",
    FaultCode.TOO_MANY_IN_FLIGHT: "Too many Commands in flight",
    FaultCode.RESPONDENT_FAILED: "Command-Respondent failed",
    FaultCode.TOO_MANY_CHANNELS: "Too many Channels",
    FaultCode.DESTINATIONS_BUSY: "Destinations busy",
    FaultCode.RESUME_REFUSED: "No Channel to resume",
    FaultCode.RESUME_GAP: "Commands lost before resuming",
    FaultCode.CHANNEL_RESUMED: "Channel resumed elsewhere",
    FaultCode.RESUME_UNAVAILABLE: "Resume unavailable",
    FaultCode.BROKER_RESTARTING: "Broker restarting: resume elsewhere",
    FaultCode.BROKER_BUSY: "Broker busy",
    FaultCode.UNKNOWN_ADDRESS: "Unknown Conversation-Address",
    FaultCode.NO_COURSE: "No Course to the domain",
    FaultCode.COURSE_UNLISTED: "Course from an unlisted domain",
    FaultCode.COURSE_CREDENTIAL_REFUSED: "Course credential refused",
    FaultCode.COURSE_REPLAYED: "Course credential replayed",
    FaultCode.COURSE_PLAIN_TEXT: "Course without TLS",
    FaultCode.HOP_LIMIT: "Hop limit reached",
    FaultCode.COURSE_LOOP: "Course loop",
    FaultCode.COURSE_QUEUE_FULL: "Course queue full",
    FaultCode.COURSE_EXPIRED: "Expired before crossing",
    FaultCode.COURSE_NOT_PERMITTED: "Not permitted across the Course",
    FaultCode.NO_ADDRESS: "No Conversation-Address",
    FaultCode.AUTHENTICATION_FAILED: "Authentication failed",
    FaultCode.UNKNOWN_AUTHENTICATION_TYPE: "Unknown authentication type",
    FaultCode.INVALID_AUTHENTICATION_CHANNEL_TYPE: "Invalid authentication channel type",
    FaultCode.ACCESS_DENIED: "Access denied",
}
