"""Fifteen item shapes agent frameworks write to a session, as they write them: the OpenAI Agents SDK's
input and output items (tool calls and their outputs, reasoning with encrypted content, hosted-tool
calls, image and file contents, the developer role, an ``EncryptedSession`` envelope) and LangChain's
serialized messages (tool calls, tool results, metadata). Each is (role, content, item): the role and
text a client extracts once, and the item it stores as given."""

from __future__ import annotations

from typing import Any

ItemShape = tuple[str, str, dict[str, Any]]

SHAPES: dict[str, ItemShape] = {
    "easy input message": ("user", "hi", {"role": "user", "content": "hi"}),
    "input message with parts": (
        "user",
        "what is the weather",
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "what is the weather"}]},
    ),
    "developer message": ("developer", "be brief", {"role": "developer", "content": "be brief"}),
    "output message": (
        "assistant",
        "It is sunny.",
        {
            "id": "msg_0a1b",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "It is sunny.", "annotations": [], "logprobs": []}],
        },
    ),
    "function call": (
        "function_call",
        "",
        {
            "type": "function_call",
            "id": "fc_01",
            "call_id": "call_01",
            "name": "get_weather",
            "arguments": '{"city": "Paris", "units": "c"}',
            "status": "completed",
        },
    ),
    "function call output": (
        "function_call_output",
        "sunny, 21 C",
        {"type": "function_call_output", "call_id": "call_01", "output": "sunny, 21 C"},
    ),
    "reasoning with encrypted content": (
        "reasoning",
        "thinking about the weather",
        {
            "type": "reasoning",
            "id": "rs_01",
            "summary": [{"type": "summary_text", "text": "thinking about the weather"}],
            "encrypted_content": "gAAAAABo" + "Zm9v" * 64,
        },
    ),
    "image content": (
        "user",
        "what is this?",
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "what is this?"},
                {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "auto"},
            ],
        },
    ),
    "file content": (
        "user",
        "",
        {
            "role": "user",
            "content": [
                {"type": "input_file", "file_data": "data:application/pdf;base64,JVBERi0=", "filename": "a.pdf"}
            ],
        },
    ),
    "empty assistant message": ("assistant", "", {"role": "assistant", "content": ""}),
    "hosted tool call": (
        "web_search_call",
        "",
        {"type": "web_search_call", "id": "ws_01", "status": "completed", "action": {"type": "search", "query": "x"}},
    ),
    "encrypted session envelope": (
        "message",
        "",
        {"__enc__": 1, "v": 1, "kid": "hkdf-v1", "payload": "gAAAAABnZm9vYmFy" * 8},
    ),
    "langchain ai message with tool calls": (
        "ai",
        "",
        {
            "type": "ai",
            "data": {
                "content": "",
                "additional_kwargs": {"refusal": None},
                "response_metadata": {"model_name": "m", "finish_reason": "tool_calls"},
                "type": "ai",
                "name": None,
                "id": "run-1",
                "tool_calls": [
                    {
                        "name": "add",
                        "args": {"a": 1.5, "b": [True, False, None], "z": -7},
                        "id": "call_9",
                        "type": "tool_call",
                    }
                ],
                "invalid_tool_calls": [],
                "usage_metadata": {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7},
            },
        },
    ),
    "langchain tool message": (
        "tool",
        "8.5",
        {
            "type": "tool",
            "data": {
                "content": "8.5",
                "tool_call_id": "call_9",
                "name": "add",
                "status": "success",
                "artifact": None,
                "additional_kwargs": {},
            },
        },
    ),
    "unicode and keys out of order": (
        "assistant",
        "héllo ✓ 😀",
        {"z": "héllo ✓ 😀", "a": {"y": [], "b": {}}, "m": 'line\nbreak "quoted" \\ back', "0": 0},
    ),
}
