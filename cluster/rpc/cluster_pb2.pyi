from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReplyBatch(_message.Message):
    __slots__ = ("replies",)
    class Reply(_message.Message):
        __slots__ = ("token", "message")
        TOKEN_FIELD_NUMBER: _ClassVar[int]
        MESSAGE_FIELD_NUMBER: _ClassVar[int]
        token: str
        message: Message
        def __init__(self, token: _Optional[str] = ..., message: _Optional[_Union[Message, _Mapping]] = ...) -> None: ...
    REPLIES_FIELD_NUMBER: _ClassVar[int]
    replies: _containers.RepeatedCompositeFieldContainer[ReplyBatch.Reply]
    def __init__(self, replies: _Optional[_Iterable[_Union[ReplyBatch.Reply, _Mapping]]] = ...) -> None: ...

class RepliesAck(_message.Message):
    __slots__ = ("delivered",)
    DELIVERED_FIELD_NUMBER: _ClassVar[int]
    delivered: int
    def __init__(self, delivered: _Optional[int] = ...) -> None: ...

class PingRequest(_message.Message):
    __slots__ = ("node", "term")
    NODE_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    node: str
    term: int
    def __init__(self, node: _Optional[str] = ..., term: _Optional[int] = ...) -> None: ...

class PingReply(_message.Message):
    __slots__ = ("node", "term", "leader", "paused", "commit_index", "down", "alarms", "not_member")
    NODE_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    DOWN_FIELD_NUMBER: _ClassVar[int]
    ALARMS_FIELD_NUMBER: _ClassVar[int]
    NOT_MEMBER_FIELD_NUMBER: _ClassVar[int]
    node: str
    term: int
    leader: str
    paused: bool
    commit_index: int
    down: _containers.RepeatedScalarFieldContainer[str]
    alarms: _containers.RepeatedScalarFieldContainer[str]
    not_member: bool
    def __init__(self, node: _Optional[str] = ..., term: _Optional[int] = ..., leader: _Optional[str] = ..., paused: bool = ..., commit_index: _Optional[int] = ..., down: _Optional[_Iterable[str]] = ..., alarms: _Optional[_Iterable[str]] = ..., not_member: bool = ...) -> None: ...

class VoteRequest(_message.Message):
    __slots__ = ("term", "candidate", "last_log_index", "last_log_term", "pre_vote")
    TERM_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_TERM_FIELD_NUMBER: _ClassVar[int]
    PRE_VOTE_FIELD_NUMBER: _ClassVar[int]
    term: int
    candidate: str
    last_log_index: int
    last_log_term: int
    pre_vote: bool
    def __init__(self, term: _Optional[int] = ..., candidate: _Optional[str] = ..., last_log_index: _Optional[int] = ..., last_log_term: _Optional[int] = ..., pre_vote: bool = ...) -> None: ...

class VoteReply(_message.Message):
    __slots__ = ("term", "granted")
    TERM_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    term: int
    granted: bool
    def __init__(self, term: _Optional[int] = ..., granted: bool = ...) -> None: ...

class LogEntry(_message.Message):
    __slots__ = ("index", "term", "command")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    index: int
    term: int
    command: bytes
    def __init__(self, index: _Optional[int] = ..., term: _Optional[int] = ..., command: _Optional[bytes] = ...) -> None: ...

class AppendRequest(_message.Message):
    __slots__ = ("term", "leader", "prev_log_index", "prev_log_term", "entries", "leader_commit")
    TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    PREV_LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    PREV_LOG_TERM_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    LEADER_COMMIT_FIELD_NUMBER: _ClassVar[int]
    term: int
    leader: str
    prev_log_index: int
    prev_log_term: int
    entries: _containers.RepeatedCompositeFieldContainer[LogEntry]
    leader_commit: int
    def __init__(self, term: _Optional[int] = ..., leader: _Optional[str] = ..., prev_log_index: _Optional[int] = ..., prev_log_term: _Optional[int] = ..., entries: _Optional[_Iterable[_Union[LogEntry, _Mapping]]] = ..., leader_commit: _Optional[int] = ...) -> None: ...

class AppendReply(_message.Message):
    __slots__ = ("term", "success", "match_index")
    TERM_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    MATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    term: int
    success: bool
    match_index: int
    def __init__(self, term: _Optional[int] = ..., success: bool = ..., match_index: _Optional[int] = ...) -> None: ...

class SnapshotRequest(_message.Message):
    __slots__ = ("term", "leader", "last_index", "last_term", "leader_commit", "data")
    TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    LAST_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_COMMIT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    term: int
    leader: str
    last_index: int
    last_term: int
    leader_commit: int
    data: bytes
    def __init__(self, term: _Optional[int] = ..., leader: _Optional[str] = ..., last_index: _Optional[int] = ..., last_term: _Optional[int] = ..., leader_commit: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class ProposeRequest(_message.Message):
    __slots__ = ("command",)
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    command: bytes
    def __init__(self, command: _Optional[bytes] = ...) -> None: ...

class ProposeReply(_message.Message):
    __slots__ = ("ok", "index", "error", "result")
    OK_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    index: int
    error: str
    result: bytes
    def __init__(self, ok: bool = ..., index: _Optional[int] = ..., error: _Optional[str] = ..., result: _Optional[bytes] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("exchange", "routing_key", "properties", "body", "publish_id")
    EXCHANGE_FIELD_NUMBER: _ClassVar[int]
    ROUTING_KEY_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_ID_FIELD_NUMBER: _ClassVar[int]
    exchange: str
    routing_key: str
    properties: bytes
    body: bytes
    publish_id: int
    def __init__(self, exchange: _Optional[str] = ..., routing_key: _Optional[str] = ..., properties: _Optional[bytes] = ..., body: _Optional[bytes] = ..., publish_id: _Optional[int] = ...) -> None: ...

class QueueCall(_message.Message):
    __slots__ = ("open", "publish", "get", "consume", "cancel", "settle", "prefetch", "batch", "publishes")
    class Batch(_message.Message):
        __slots__ = ("calls",)
        CALLS_FIELD_NUMBER: _ClassVar[int]
        calls: _containers.RepeatedCompositeFieldContainer[QueueCall]
        def __init__(self, calls: _Optional[_Iterable[_Union[QueueCall, _Mapping]]] = ...) -> None: ...
    class Open(_message.Message):
        __slots__ = ("vhost", "queue", "owner", "epoch")
        VHOST_FIELD_NUMBER: _ClassVar[int]
        QUEUE_FIELD_NUMBER: _ClassVar[int]
        OWNER_FIELD_NUMBER: _ClassVar[int]
        EPOCH_FIELD_NUMBER: _ClassVar[int]
        vhost: str
        queue: str
        owner: str
        epoch: int
        def __init__(self, vhost: _Optional[str] = ..., queue: _Optional[str] = ..., owner: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...
    class Publish(_message.Message):
        __slots__ = ("seq", "message")
        SEQ_FIELD_NUMBER: _ClassVar[int]
        MESSAGE_FIELD_NUMBER: _ClassVar[int]
        seq: int
        message: Message
        def __init__(self, seq: _Optional[int] = ..., message: _Optional[_Union[Message, _Mapping]] = ...) -> None: ...
    class Publishes(_message.Message):
        __slots__ = ("packed",)
        PACKED_FIELD_NUMBER: _ClassVar[int]
        packed: bytes
        def __init__(self, packed: _Optional[bytes] = ...) -> None: ...
    class Get(_message.Message):
        __slots__ = ("no_ack",)
        NO_ACK_FIELD_NUMBER: _ClassVar[int]
        no_ack: bool
        def __init__(self, no_ack: bool = ...) -> None: ...
    class Consume(_message.Message):
        __slots__ = ("tag", "no_ack", "prefetch", "exclusive", "arguments")
        TAG_FIELD_NUMBER: _ClassVar[int]
        NO_ACK_FIELD_NUMBER: _ClassVar[int]
        PREFETCH_FIELD_NUMBER: _ClassVar[int]
        EXCLUSIVE_FIELD_NUMBER: _ClassVar[int]
        ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
        tag: str
        no_ack: bool
        prefetch: int
        exclusive: bool
        arguments: bytes
        def __init__(self, tag: _Optional[str] = ..., no_ack: bool = ..., prefetch: _Optional[int] = ..., exclusive: bool = ..., arguments: _Optional[bytes] = ...) -> None: ...
    class Cancel(_message.Message):
        __slots__ = ("tag",)
        TAG_FIELD_NUMBER: _ClassVar[int]
        tag: str
        def __init__(self, tag: _Optional[str] = ...) -> None: ...
    class Settle(_message.Message):
        __slots__ = ("ids", "mode")
        IDS_FIELD_NUMBER: _ClassVar[int]
        MODE_FIELD_NUMBER: _ClassVar[int]
        ids: _containers.RepeatedScalarFieldContainer[int]
        mode: int
        def __init__(self, ids: _Optional[_Iterable[int]] = ..., mode: _Optional[int] = ...) -> None: ...
    class Prefetch(_message.Message):
        __slots__ = ("tag", "count")
        TAG_FIELD_NUMBER: _ClassVar[int]
        COUNT_FIELD_NUMBER: _ClassVar[int]
        tag: str
        count: int
        def __init__(self, tag: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...
    OPEN_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_FIELD_NUMBER: _ClassVar[int]
    GET_FIELD_NUMBER: _ClassVar[int]
    CONSUME_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    SETTLE_FIELD_NUMBER: _ClassVar[int]
    PREFETCH_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    PUBLISHES_FIELD_NUMBER: _ClassVar[int]
    open: QueueCall.Open
    publish: QueueCall.Publish
    get: QueueCall.Get
    consume: QueueCall.Consume
    cancel: QueueCall.Cancel
    settle: QueueCall.Settle
    prefetch: QueueCall.Prefetch
    batch: QueueCall.Batch
    publishes: QueueCall.Publishes
    def __init__(self, open: _Optional[_Union[QueueCall.Open, _Mapping]] = ..., publish: _Optional[_Union[QueueCall.Publish, _Mapping]] = ..., get: _Optional[_Union[QueueCall.Get, _Mapping]] = ..., consume: _Optional[_Union[QueueCall.Consume, _Mapping]] = ..., cancel: _Optional[_Union[QueueCall.Cancel, _Mapping]] = ..., settle: _Optional[_Union[QueueCall.Settle, _Mapping]] = ..., prefetch: _Optional[_Union[QueueCall.Prefetch, _Mapping]] = ..., batch: _Optional[_Union[QueueCall.Batch, _Mapping]] = ..., publishes: _Optional[_Union[QueueCall.Publishes, _Mapping]] = ...) -> None: ...

class QueueEvent(_message.Message):
    __slots__ = ("opened", "confirm", "delivery", "empty", "cancelled", "error", "consume_ok", "batch")
    class Batch(_message.Message):
        __slots__ = ("events",)
        EVENTS_FIELD_NUMBER: _ClassVar[int]
        events: _containers.RepeatedCompositeFieldContainer[QueueEvent]
        def __init__(self, events: _Optional[_Iterable[_Union[QueueEvent, _Mapping]]] = ...) -> None: ...
    class Opened(_message.Message):
        __slots__ = ("message_count", "consumer_count")
        MESSAGE_COUNT_FIELD_NUMBER: _ClassVar[int]
        CONSUMER_COUNT_FIELD_NUMBER: _ClassVar[int]
        message_count: int
        consumer_count: int
        def __init__(self, message_count: _Optional[int] = ..., consumer_count: _Optional[int] = ...) -> None: ...
    class Confirm(_message.Message):
        __slots__ = ("seqs", "ok")
        SEQS_FIELD_NUMBER: _ClassVar[int]
        OK_FIELD_NUMBER: _ClassVar[int]
        seqs: _containers.RepeatedScalarFieldContainer[int]
        ok: bool
        def __init__(self, seqs: _Optional[_Iterable[int]] = ..., ok: bool = ...) -> None: ...
    class Delivery(_message.Message):
        __slots__ = ("tag", "id", "redelivered", "message", "message_count", "key")
        TAG_FIELD_NUMBER: _ClassVar[int]
        ID_FIELD_NUMBER: _ClassVar[int]
        REDELIVERED_FIELD_NUMBER: _ClassVar[int]
        MESSAGE_FIELD_NUMBER: _ClassVar[int]
        MESSAGE_COUNT_FIELD_NUMBER: _ClassVar[int]
        KEY_FIELD_NUMBER: _ClassVar[int]
        tag: str
        id: int
        redelivered: bool
        message: Message
        message_count: int
        key: int
        def __init__(self, tag: _Optional[str] = ..., id: _Optional[int] = ..., redelivered: bool = ..., message: _Optional[_Union[Message, _Mapping]] = ..., message_count: _Optional[int] = ..., key: _Optional[int] = ...) -> None: ...
    class Empty(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class Cancelled(_message.Message):
        __slots__ = ("tag",)
        TAG_FIELD_NUMBER: _ClassVar[int]
        tag: str
        def __init__(self, tag: _Optional[str] = ...) -> None: ...
    class Error(_message.Message):
        __slots__ = ("code", "text")
        CODE_FIELD_NUMBER: _ClassVar[int]
        TEXT_FIELD_NUMBER: _ClassVar[int]
        code: int
        text: str
        def __init__(self, code: _Optional[int] = ..., text: _Optional[str] = ...) -> None: ...
    class ConsumeOk(_message.Message):
        __slots__ = ("tag",)
        TAG_FIELD_NUMBER: _ClassVar[int]
        tag: str
        def __init__(self, tag: _Optional[str] = ...) -> None: ...
    OPENED_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    EMPTY_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CONSUME_OK_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    opened: QueueEvent.Opened
    confirm: QueueEvent.Confirm
    delivery: QueueEvent.Delivery
    empty: QueueEvent.Empty
    cancelled: QueueEvent.Cancelled
    error: QueueEvent.Error
    consume_ok: QueueEvent.ConsumeOk
    batch: QueueEvent.Batch
    def __init__(self, opened: _Optional[_Union[QueueEvent.Opened, _Mapping]] = ..., confirm: _Optional[_Union[QueueEvent.Confirm, _Mapping]] = ..., delivery: _Optional[_Union[QueueEvent.Delivery, _Mapping]] = ..., empty: _Optional[_Union[QueueEvent.Empty, _Mapping]] = ..., cancelled: _Optional[_Union[QueueEvent.Cancelled, _Mapping]] = ..., error: _Optional[_Union[QueueEvent.Error, _Mapping]] = ..., consume_ok: _Optional[_Union[QueueEvent.ConsumeOk, _Mapping]] = ..., batch: _Optional[_Union[QueueEvent.Batch, _Mapping]] = ...) -> None: ...

class ControlRequest(_message.Message):
    __slots__ = ("command", "arguments")
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    command: str
    arguments: bytes
    def __init__(self, command: _Optional[str] = ..., arguments: _Optional[bytes] = ...) -> None: ...

class ControlReply(_message.Message):
    __slots__ = ("ok", "error", "result")
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    error: str
    result: bytes
    def __init__(self, ok: bool = ..., error: _Optional[str] = ..., result: _Optional[bytes] = ...) -> None: ...

class MirrorOp(_message.Message):
    __slots__ = ("kind", "key", "message", "redelivered", "keys", "ttl_left_ms", "dedup_id", "dedup_seen_ms")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ENQUEUE: _ClassVar[MirrorOp.Kind]
        DELIVER: _ClassVar[MirrorOp.Kind]
        REMOVE: _ClassVar[MirrorOp.Kind]
        REQUEUE: _ClassVar[MirrorOp.Kind]
    ENQUEUE: MirrorOp.Kind
    DELIVER: MirrorOp.Kind
    REMOVE: MirrorOp.Kind
    REQUEUE: MirrorOp.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REDELIVERED_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    TTL_LEFT_MS_FIELD_NUMBER: _ClassVar[int]
    DEDUP_ID_FIELD_NUMBER: _ClassVar[int]
    DEDUP_SEEN_MS_FIELD_NUMBER: _ClassVar[int]
    kind: MirrorOp.Kind
    key: int
    message: Message
    redelivered: bool
    keys: _containers.RepeatedScalarFieldContainer[int]
    ttl_left_ms: int
    dedup_id: bytes
    dedup_seen_ms: int
    def __init__(self, kind: _Optional[_Union[MirrorOp.Kind, str]] = ..., key: _Optional[int] = ..., message: _Optional[_Union[Message, _Mapping]] = ..., redelivered: bool = ..., keys: _Optional[_Iterable[int]] = ..., ttl_left_ms: _Optional[int] = ..., dedup_id: _Optional[bytes] = ..., dedup_seen_ms: _Optional[int] = ...) -> None: ...

class MirrorBatch(_message.Message):
    __slots__ = ("vhost", "queue", "epoch", "master", "reset", "base_seq", "snapshot_done", "first_seq", "ops", "reconcile", "keys", "delivered_keys", "fill", "dedup_size", "dedup_ids", "dedup_seen_ms")
    VHOST_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MASTER_FIELD_NUMBER: _ClassVar[int]
    RESET_FIELD_NUMBER: _ClassVar[int]
    BASE_SEQ_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_DONE_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    RECONCILE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_KEYS_FIELD_NUMBER: _ClassVar[int]
    FILL_FIELD_NUMBER: _ClassVar[int]
    DEDUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    DEDUP_IDS_FIELD_NUMBER: _ClassVar[int]
    DEDUP_SEEN_MS_FIELD_NUMBER: _ClassVar[int]
    vhost: str
    queue: str
    epoch: int
    master: str
    reset: bool
    base_seq: int
    snapshot_done: bool
    first_seq: int
    ops: _containers.RepeatedCompositeFieldContainer[MirrorOp]
    reconcile: bool
    keys: _containers.RepeatedScalarFieldContainer[int]
    delivered_keys: _containers.RepeatedScalarFieldContainer[int]
    fill: bool
    dedup_size: int
    dedup_ids: _containers.RepeatedScalarFieldContainer[bytes]
    dedup_seen_ms: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, vhost: _Optional[str] = ..., queue: _Optional[str] = ..., epoch: _Optional[int] = ..., master: _Optional[str] = ..., reset: bool = ..., base_seq: _Optional[int] = ..., snapshot_done: bool = ..., first_seq: _Optional[int] = ..., ops: _Optional[_Iterable[_Union[MirrorOp, _Mapping]]] = ..., reconcile: bool = ..., keys: _Optional[_Iterable[int]] = ..., delivered_keys: _Optional[_Iterable[int]] = ..., fill: bool = ..., dedup_size: _Optional[int] = ..., dedup_ids: _Optional[_Iterable[bytes]] = ..., dedup_seen_ms: _Optional[_Iterable[int]] = ...) -> None: ...

class MirrorAck(_message.Message):
    __slots__ = ("seq", "error", "missing", "resync")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    RESYNC_FIELD_NUMBER: _ClassVar[int]
    seq: int
    error: str
    missing: _containers.RepeatedScalarFieldContainer[int]
    resync: bool
    def __init__(self, seq: _Optional[int] = ..., error: _Optional[str] = ..., missing: _Optional[_Iterable[int]] = ..., resync: bool = ...) -> None: ...
