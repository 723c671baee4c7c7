"""Python client for the sessionmem memory endpoint (the launcher on ``http://127.0.0.1:2998`` in an
agent pod), and adapters for agent frameworks.

    from sessionmem_client import MemoryClient, new_conversation_id

    with MemoryClient() as memory:
        cid = new_conversation_id()
        memory.append_exchange(cid, "Hi, I'm Ada", "Hello Ada!")
        print([e.content for e in memory.read(cid).entries])

Framework adapters live in submodules that import their framework only when they are imported:
``sessionmem_client.langchain`` (langchain-core) and ``sessionmem_client.openai_agents`` (openai-agents).
"""

from sessionmem_client._requests import EntryLike, default_base_url
from sessionmem_client.client import AsyncMemoryClient, MemoryClient
from sessionmem_client.retriever import MemoryAugmentedRetriever
from sessionmem_core.errors import (
    AuthUnavailable,
    BackendUnavailable,
    CapabilityNotAccepted,
    ConversationExists,
    DataKeyUnavailable,
    Forbidden,
    InvalidConversationId,
    InvalidMessageId,
    InvalidRequest,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    RateLimited,
    SealedEntryInvalid,
    SessionMemError,
    TurnNotLive,
    Unauthenticated,
    UserCapabilityRequired,
    VersionConflict,
)
from sessionmem_core.keys import is_valid_id, new_conversation_id, validate_conversation_id
from sessionmem_core.wire import (
    AppendResponse,
    ClearResponse,
    ConversationInfo,
    ConversationList,
    ConversationRef,
    DeleteResponse,
    Entry,
    EntryIn,
    ForkResponse,
    History,
    PopResponse,
    ReplaceResponse,
    RewindResponse,
    Role,
    SearchResponse,
    UserErasure,
)

__all__ = [
    "AppendResponse",
    "AsyncMemoryClient",
    "AuthUnavailable",
    "BackendUnavailable",
    "CapabilityNotAccepted",
    "ClearResponse",
    "ConversationExists",
    "ConversationInfo",
    "ConversationList",
    "ConversationRef",
    "DataKeyUnavailable",
    "DeleteResponse",
    "Entry",
    "EntryIn",
    "EntryLike",
    "Forbidden",
    "ForkResponse",
    "History",
    "InvalidConversationId",
    "InvalidMessageId",
    "InvalidRequest",
    "MemoryAugmentedRetriever",
    "MemoryClient",
    "NotFound",
    "Overloaded",
    "PayloadTooLarge",
    "PopResponse",
    "RateLimited",
    "ReplaceResponse",
    "RewindResponse",
    "Role",
    "SealedEntryInvalid",
    "SearchResponse",
    "SessionMemError",
    "TurnNotLive",
    "Unauthenticated",
    "UserCapabilityRequired",
    "UserErasure",
    "VersionConflict",
    "default_base_url",
    "is_valid_id",
    "new_conversation_id",
    "validate_conversation_id",
]
