"""The ids real clients already send, read without configuration.

An id a client sends narrows: a conversation id separates two chats of one caller, an end-user
id separates two users of one key. It never widens: every id is scoped by the tenant and the
caller's credential like all other state (`proxy.chain.caller_seed`), so a client claiming
another caller's id reaches nothing of theirs. Which client sends what (README, "Conversation
identity"):

    Keel's own              X-Keel-Conversation, X-Keel-User; metadata.conversation_id
    OpenAI API              user, safety_identifier; Responses `conversation` (an id or {"id"})
    LibreChat               X-Conversation-Id / X-User-Id, when an endpoint's `headers` map them
                            from {{LIBRECHAT_BODY_CONVERSATIONID}} / {{LIBRECHAT_USER_ID}} (documented)
    Open WebUI              X-OpenWebUI-Chat-Id, X-OpenWebUI-User-Id (ENABLE_FORWARD_USER_INFO_HEADERS)
    Claude Code             X-Claude-Code-Session-Id; metadata.user_id ("user_<h>_account_<a>_session_<s>",
                            or a JSON text with device_id / account_uuid / session_id)
    Codex CLI               thread-id and session-id headers (session_id, thread_id in older builds);
                            its prompt_cache_key is the thread id too
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

import orjson

from proxy.jsontext import Json, JsonObject

# Headers naming the conversation, most specific first.
CONVERSATION_HEADERS = ("x-keel-conversation", "x-conversation-id", "x-openwebui-chat-id",
                        "x-claude-code-session-id", "thread-id", "thread_id", "session-id", "session_id")
USER_HEADERS = ("x-keel-user", "x-openwebui-user-id", "x-user-id")
_CLAUDE_CODE_USER = re.compile(r"^(user_[0-9a-f]+(?:_account_[0-9a-f-]*)?)_session_([0-9a-f-]+)$")
MAX_ID_CHARS = 512


def _text(value: Json) -> str | None:
    """An id as text; a very long one by its digest (never cut: two ids alike for 512 characters
    are still two)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (str, int)) and str(value) != "":
        text = str(value)
        if len(text) <= MAX_ID_CHARS:
            return text
        return "sha256:" + hashlib.sha256(text.encode(errors="surrogatepass")).hexdigest()
    return None


def _claude_code(metadata: Json) -> tuple[str | None, str | None]:
    """Claude Code's `metadata.user_id`: (the user, the session) it carries, either form."""
    raw = metadata.get("user_id") if isinstance(metadata, dict) else None
    if not isinstance(raw, str):
        return None, None
    found = _CLAUDE_CODE_USER.match(raw)
    if found:
        return found.group(1), found.group(2)
    if raw.startswith("{"):
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None, None
        if isinstance(data, dict):
            user = _text(data.get("account_uuid")) or _text(data.get("device_id"))
            return user, _text(data.get("session_id"))
    return None, None


def conversation_id(headers: Mapping[str, str], body: JsonObject) -> str | None:
    """The conversation a client names, if it names one."""
    for name in CONVERSATION_HEADERS:
        value = _text(headers.get(name))
        if value:
            return value
    metadata = body.get("metadata")
    value = _text(metadata.get("conversation_id")) if isinstance(metadata, dict) else None
    if value:
        return value
    conversation = body.get("conversation")  # the Responses API's own
    value = _text(conversation.get("id")) if isinstance(conversation, dict) else _text(conversation)
    return value or _claude_code(metadata)[1]


def end_user(headers: Mapping[str, str], body: JsonObject) -> str | None:
    """The end user a client names, if it names one."""
    value = _text(body.get("user")) or _text(body.get("safety_identifier"))
    if value:
        return value
    for name in USER_HEADERS:
        value = _text(headers.get(name))
        if value:
            return value
    metadata = body.get("metadata")
    claude_user, _ = _claude_code(metadata)
    if claude_user:
        return claude_user
    return _text(metadata.get("user_id")) if isinstance(metadata, dict) else None
