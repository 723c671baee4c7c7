"""Retrieval that mixes what was said in the conversation with a document corpus.

``MemoryAugmentedRetriever.retrieve(query, top_k)`` gives ``round(memory_weight * top_k)`` of the slots to
keyword-search hits from the conversation (memory first) and the rest to the corpus retriever, without
duplicates. Slots one side cannot fill go to the other, so ``top_k`` results come back whenever the two
together have that many. Memory is best-effort: when the memory endpoint is unavailable the corpus
alone answers (``fail_open=False`` raises instead).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from sessionmem_client._requests import MAX_SEARCH_LIMIT
from sessionmem_client.client import AsyncMemoryClient, MemoryClient
from sessionmem_core import wire
from sessionmem_core.errors import BackendUnavailable
from sessionmem_core.keys import validate_conversation_id

__all__ = ["CorpusRetriever", "MemoryAugmentedRetriever", "mix"]

_LOG = logging.getLogger("sessionmem.client.retriever")

#: ``(query, k) -> up to k passages``, best first.
CorpusRetriever = Callable[[str, int], list[str]]


def _key(text: str) -> str:
    return " ".join(text.split()).casefold()


def mix(memory: Iterable[str], corpus: Iterable[str], top_k: int, memory_slots: int) -> list[str]:
    """Memory hits first (up to ``memory_slots``), then the corpus, then any memory hits left over, until
    ``top_k``; passages that differ only in case or whitespace count once, and empty ones not at all."""
    memory_hits, corpus_hits = list(memory), list(corpus)
    picked: list[str] = []
    seen: set[str] = set()

    def take(candidates: list[str], until: int) -> None:
        while candidates and len(picked) < until:
            text = candidates.pop(0)
            key = _key(text)
            if key and key not in seen:
                seen.add(key)
                picked.append(text)

    take(memory_hits, memory_slots)
    take(corpus_hits, top_k)
    take(memory_hits, top_k)
    return picked


class MemoryAugmentedRetriever:
    """``retrieve`` with a :class:`MemoryClient`, ``aretrieve`` with an :class:`AsyncMemoryClient`."""

    def __init__(
        self,
        memory_client: MemoryClient | AsyncMemoryClient,
        conversation_id: str,
        corpus_retriever: CorpusRetriever,
        memory_weight: float = 0.3,
        *,
        fail_open: bool = True,
    ) -> None:
        if not 0.0 <= memory_weight <= 1.0:
            raise ValueError(f"memory_weight must be within [0, 1] (got {memory_weight})")
        self.memory_client = memory_client
        self.conversation_id = validate_conversation_id(conversation_id)
        self.corpus_retriever = corpus_retriever
        self.memory_weight = memory_weight
        self.fail_open = fail_open

    def memory_slots(self, top_k: int) -> int:
        return min(top_k, round(self.memory_weight * top_k))

    def _search_limit(self, query: str, top_k: int) -> int:
        """How many hits to ask memory for; 0 when memory is not asked (no weight, or a blank query)."""
        if self.memory_weight <= 0 or not query.strip():
            return 0
        # Ask for more than the slots: hits that duplicate each other, or later fill corpus gaps.
        return max(1, min(MAX_SEARCH_LIMIT, top_k))

    def _unavailable(self, exc: BackendUnavailable) -> list[str]:
        """Memory could not be asked: the corpus alone answers, unless the retriever fails closed."""
        if not self.fail_open:
            raise exc
        _LOG.warning("memory unavailable; answering from the corpus only", exc_info=exc)
        return []

    def _mixed(self, query: str, top_k: int, memory: list[str]) -> list[str]:
        slots = self.memory_slots(top_k)
        # Ask the corpus for enough to fill its slots even when some of its passages repeat memory hits.
        return mix(memory, self.corpus_retriever(query, top_k + slots), top_k, slots)

    def retrieve(self, query: str, top_k: int) -> list[str]:
        if not isinstance(self.memory_client, MemoryClient):
            raise TypeError("retrieve() needs a MemoryClient; with an AsyncMemoryClient use aretrieve()")
        memory: list[str] = []
        if top_k > 0 and (limit := self._search_limit(query, top_k)):
            try:
                memory = _contents(self.memory_client.search(self.conversation_id, query, limit))
            except BackendUnavailable as exc:
                memory = self._unavailable(exc)
        return self._mixed(query, top_k, memory) if top_k > 0 else []

    async def aretrieve(self, query: str, top_k: int) -> list[str]:
        if not isinstance(self.memory_client, AsyncMemoryClient):
            raise TypeError("aretrieve() needs an AsyncMemoryClient; with a MemoryClient use retrieve()")
        memory: list[str] = []
        if top_k > 0 and (limit := self._search_limit(query, top_k)):
            try:
                memory = _contents(await self.memory_client.search(self.conversation_id, query, limit))
            except BackendUnavailable as exc:
                memory = self._unavailable(exc)
        return self._mixed(query, top_k, memory) if top_k > 0 else []


def _contents(found: wire.SearchResponse) -> list[str]:
    return [entry.content for entry in found.matches]
