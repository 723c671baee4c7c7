"""MemoryAugmentedRetriever: memory hits first, the corpus for the rest, no duplicates; real stack."""

from __future__ import annotations

import asyncio

import pytest

from sessionmem_client import (
    AsyncMemoryClient,
    BackendUnavailable,
    InvalidConversationId,
    MemoryAugmentedRetriever,
    MemoryClient,
)
from sessionmem_client.retriever import mix
from sessionmem_launcher.server import Launcher
from tests.support.valkey import free_port

CORPUS = [
    "Green tea is brewed at 80 degrees.",
    "Black tea is brewed at 95 degrees.",
    "Oolong tea sits between green and black tea.",
    "Coffee is brewed at 93 degrees.",
    "Tea bags should not be squeezed.",
    "Matcha is a powdered green tea.",
    "Herbal infusions are not tea.",
    "Store tea away from light.",
    "Tea contains caffeine.",
    "Water quality matters for tea.",
]
TEA = [p for p in CORPUS if "tea" in p.lower()]  # all but the coffee passage


class Corpus:
    """A keyword retriever over CORPUS that records what it was asked."""

    def __init__(self, passages: list[str]) -> None:
        self.passages = passages
        self.asked: list[tuple[str, int]] = []

    def __call__(self, query: str, k: int) -> list[str]:
        self.asked.append((query, k))
        terms = set(query.lower().split())
        hits = [p for p in self.passages if terms & set(p.lower().rstrip(".").split())]
        return hits[:k]


def memory_url(launcher: Launcher) -> str:
    return f"http://127.0.0.1:{launcher.memory_port}"


async def seed(launcher: Launcher, conversation_id: str) -> None:
    async with AsyncMemoryClient(memory_url(launcher)) as memory:
        await memory.append_exchange(conversation_id, "I only drink green tea", "Noted: green tea")
        await memory.append_exchange(conversation_id, "My order number is 66", "Order 66 noted")
        await memory.append_exchange(conversation_id, "no tea after 6pm please", "Understood")


async def test_memory_fills_its_share_first_then_the_corpus(launcher: Launcher) -> None:
    await seed(launcher, "prefs")
    corpus = Corpus(CORPUS)

    def retrieve() -> list[str]:
        with MemoryClient(memory_url(launcher)) as memory:
            return MemoryAugmentedRetriever(memory, "prefs", corpus, memory_weight=0.3).retrieve("green tea", 10)

    results = await asyncio.to_thread(retrieve)
    assert len(results) == 10 and len(set(results)) == 10
    # round(0.3 * 10) = 3 slots from memory, best keyword matches first (newest first on ties).
    assert results[:3] == ["Noted: green tea", "I only drink green tea", "no tea after 6pm please"]
    assert results[3:] == TEA[:7]
    assert corpus.asked == [("green tea", 13)], "asked for enough to fill its slots despite duplicates"


async def test_duplicates_count_once_and_each_side_backfills_the_other(launcher: Launcher) -> None:
    await seed(launcher, "dups")
    async with AsyncMemoryClient(memory_url(launcher)) as memory:
        # A corpus passage that repeats a memory hit (up to case and spaces) is not returned twice.
        corpus = Corpus(["noted:  GREEN tea", "Green tea is brewed at 80 degrees."])
        retriever = MemoryAugmentedRetriever(memory, "dups", corpus, memory_weight=0.5)
        assert await retriever.aretrieve("green tea", 4) == [
            "Noted: green tea",
            "I only drink green tea",
            "Green tea is brewed at 80 degrees.",
            "no tea after 6pm please",  # the corpus ran short: memory fills the slot
        ]
        # Memory has fewer hits than its share: the corpus fills the rest.
        few = MemoryAugmentedRetriever(memory, "dups", Corpus(CORPUS), memory_weight=0.5)
        assert await few.aretrieve("order", 4) == ["Order 66 noted", "My order number is 66"]
        mixed = await few.aretrieve("order tea", 4)
        assert mixed[:2] == ["no tea after 6pm please", "Order 66 noted"], "one term each: newest first"
        assert mixed[2:] == TEA[:2]
        # Weight 0: the corpus alone, memory is not even asked; weight 1: memory first, corpus after.
        assert await MemoryAugmentedRetriever(memory, "dups", Corpus(CORPUS), 0.0).aretrieve("tea", 3) == TEA[:3]
        only_memory = await MemoryAugmentedRetriever(memory, "dups", Corpus(CORPUS), 1.0).aretrieve("tea", 4)
        assert only_memory[:3] == ["no tea after 6pm please", "Noted: green tea", "I only drink green tea"]
        assert only_memory[3] == TEA[0]
        assert await retriever.aretrieve("tea", 0) == []


async def test_memory_unavailable_falls_back_to_the_corpus() -> None:
    async with AsyncMemoryClient(f"http://127.0.0.1:{free_port()}") as down:
        retriever = MemoryAugmentedRetriever(down, "c", Corpus(CORPUS), memory_weight=0.5)
        assert await retriever.aretrieve("coffee", 2) == ["Coffee is brewed at 93 degrees."]
        strict = MemoryAugmentedRetriever(down, "c", Corpus(CORPUS), memory_weight=0.5, fail_open=False)
        with pytest.raises(BackendUnavailable):
            await strict.aretrieve("coffee", 2)
        corpus_only = MemoryAugmentedRetriever(down, "c", Corpus(CORPUS), memory_weight=0.0, fail_open=False)
        assert await corpus_only.aretrieve("coffee", 2) == ["Coffee is brewed at 93 degrees."], "memory not asked"
        with pytest.raises(TypeError, match="aretrieve"):
            retriever.retrieve("coffee", 2)


def test_arguments_are_checked() -> None:
    with MemoryClient("http://127.0.0.1:9") as memory:
        with pytest.raises(ValueError, match="memory_weight"):
            MemoryAugmentedRetriever(memory, "c", Corpus(CORPUS), memory_weight=1.5)
        with pytest.raises(InvalidConversationId):
            MemoryAugmentedRetriever(memory, "bad:id", Corpus(CORPUS))
        with pytest.raises(TypeError, match="retrieve"):
            asyncio.run(MemoryAugmentedRetriever(memory, "c", Corpus(CORPUS)).aretrieve("x", 1))


def test_mix() -> None:
    assert mix(["m1", "m2", "m3"], ["c1", "c2"], top_k=3, memory_slots=1) == ["m1", "c1", "c2"]
    assert mix(["m1", "m2", "m3"], ["c1"], top_k=3, memory_slots=1) == ["m1", "c1", "m2"]
    assert mix([], ["c1", "c2", "c3"], top_k=2, memory_slots=1) == ["c1", "c2"]
    assert mix(["Same  text", ""], ["same text", "", "c"], top_k=5, memory_slots=2) == ["Same  text", "c"]
