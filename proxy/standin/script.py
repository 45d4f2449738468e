"""What the stand-in model says: deterministic, and scriptable from the newest user message.

Directives (anywhere in the newest user message's text):
    [[call NAME {"arg": 1}]]  call tool NAME if offered; else call `tool_search` for it if
                              that is offered (and NAME once the search offered it); else
                              say the tool is unavailable. Several directives: several calls
    [[callx HEX {...}]]       the same, the name hex-encoded (hidden from name matching)
    [[callq HEX {...}]]       like callx, but tool_search is called with the user's words, as a
                              model would search, never with the name
With `call_tool` offered, a tool the search found that is still not in the tool list is
called through `call_tool` (Keel's dispatch stability).
    [[error 503]]             answer with that HTTP status and an OpenAI-style error
    [[sleep 1.5]]             wait that many seconds before answering
    [[drip 0.05]]             (streaming) wait that many seconds between content chunks
    [[cut]]                   (streaming) break the connection after the first chunks
    [[words 40]]              answer with that many words
    [[ramble 40]]             answer "You said: …" and that many words drawn as a model samples
                              them: the same request gets the same words, another request others
                              (a long answer only a participant holds: proof of continuity)
    [[sample 40]]             only sampled words, drawn afresh each time (an answer that repeats nothing
                              it was told and that nobody replaying the request gets again)
After a tool result (the last message has role `tool`) it answers with text about it.
Offered `set_memory`, it acts as a memory model: it stores what the newest message asks to keep.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import re
from dataclasses import dataclass, replace
from typing import Any

import orjson

from proxy.jsontext import Json, JsonObject
from proxy.messages import message_text

_DIRECTIVE = re.compile(r"\[\[(callx|callq|call|error|sleep|drip|cut|words|ramble|sample)\s*([^\]]*)\]\]")


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Script:
    text: str | None = None
    logprobs: list[JsonObject] | None = None  # for the first answer token
    tool_calls: tuple[ToolCall, ...] = ()
    error_status: int | None = None
    sleep: float = 0.0
    drip: float = 0.0
    cut: bool = False

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.tool_calls else "stop"


def _offered(body: JsonObject) -> set[str]:
    names = set()
    for tool in body.get("tools") or []:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.add(fn["name"])
    return names


def _call_id(seed: str, n: int) -> str:
    return "call_" + hashlib.blake2b(f"{seed}:{n}".encode(), digest_size=12).hexdigest()


def plan_answer(body: JsonObject) -> Script:
    messages = body.get("messages") or []
    last = messages[-1] if messages else {}
    users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    newest = message_text(users[-1]) if users else ""
    directives = _DIRECTIVE.findall(newest)
    found = {kind: arg.strip() for kind, arg in directives}
    wanted = [arg.strip() if kind == "call" else _unhex(arg.strip()) for kind, arg in directives
              if kind in ("call", "callx", "callq")]
    by_words = "callq" in found
    error = int(found["error"]) if found.get("error", "").isdigit() else None
    base = Script(error_status=error, sleep=_seconds(found, "sleep"), drip=_seconds(found, "drip"),
                  cut="cut" in found)

    offered = _offered(body)
    called = _called_since_user(messages)
    seed = f"{len(messages)}:{newest}"
    pending = [w for w in wanted if w.partition(" ")[0] not in called]
    # a tool outside the tool list is reached through call_tool when that is offered, once a search
    # (or a <tools_update> in the newest message) has shown its schema
    dispatch = "call_tool" in offered and ("tool_search" in called or "<tools_update>" in newest)
    if pending and (last.get("role") != "tool" or dispatch or any(w.partition(" ")[0] in offered for w in pending)):
        calls: list[ToolCall] = []
        missing: list[str] = []
        for want in pending:
            name, _, args = want.partition(" ")
            if name in offered:
                calls.append(ToolCall(_call_id(seed, len(calls)), name, args.strip() or "{}"))
            elif dispatch:
                generic = orjson.dumps({"name": name, "arguments": orjson.loads(args.strip() or "{}")}).decode()
                calls.append(ToolCall(_call_id(seed, len(calls)), "call_tool", generic))
            else:
                missing.append(name)
        if missing and "tool_search" in offered and "tool_search" not in called:
            # [[call]] searches by exact name; [[callx]] like a model would: by what the user asked
            search = {"query": _DIRECTIVE.sub("", newest).strip()} if by_words else {"query": " ".join(missing),
                                                                                  "names": missing}
            arguments = orjson.dumps(search).decode()
            calls.append(ToolCall(_call_id(seed, len(calls)), "tool_search", arguments))
        elif missing and not calls:
            return _with(base, text=f"The tool {missing[0]} is not available to me.")
        if calls:
            return _with(base, tool_calls=tuple(calls))
    if last.get("role") == "tool":
        result = message_text(last)[:200]
        name = _tool_name_for(messages, last.get("tool_call_id"))
        return _with(base, text=f"The {name} tool returned: {result}")
    if body.get("logprobs") and "<newest_message>" in newest:  # asked as a yes/no judge
        return judge(newest, base)
    if body.get("logprobs") and "<tools>" in newest and "<user_message>" in newest:  # asked to pick tools
        return pick(newest, base)
    if "set_memory" in offered:
        ops = memory_ops(messages, seed)
        return _with(base, tool_calls=ops) if ops else _with(base, text="Nothing to keep.")
    if "words" in found and found["words"].isdigit():
        count = int(found["words"])
        return _with(base, text=" ".join(f"word{i}" for i in range(count)))
    if found.get("sample", "").isdigit():
        return _with(base, text=ramble(os.urandom(16), int(found["sample"])))
    clean = _DIRECTIVE.sub("", newest).strip()
    text = f"You said: {clean}" if clean else "Hello! How can I help?"
    if found.get("ramble", "").isdigit():
        text += " " + ramble(orjson.dumps(body.get("messages")), int(found["ramble"]))
    return _with(base, text=text)


_WORDS = ["river", "stone", "meadow", "ridge", "cedar", "valley", "harbor", "lantern", "willow", "granite", "orchard",
          "summit", "breeze", "thistle", "canyon", "marsh", "pebble", "glacier", "fern", "dune", "heron", "basalt",
          "tide", "hollow"]


def ramble(seed: bytes, count: int) -> str:
    """`count` words as a model might sample them: fixed by `seed`, different for another."""
    digest = hashlib.shake_256(seed).digest(2 * count)
    return " ".join(_WORDS[int.from_bytes(digest[2 * i:2 * i + 2], "big") % len(_WORDS)] for i in range(count))


def _unhex(arg: str) -> str:
    name, _, args = arg.partition(" ")
    try:
        return bytes.fromhex(name).decode() + (" " + args if args else "")
    except ValueError:
        return arg


def hidden_call(name: str, arguments: str = "", search_by_words: bool = False) -> str:
    """A [[callx]] (or [[callq]]) directive: like [[call]], with the name hex-encoded so that
    nothing reading the message (Keel's name matching, a ranker) can see which tool it names."""
    kind = "callq" if search_by_words else "callx"
    return f"[[{kind} {name.encode().hex()}{' ' + arguments if arguments else ''}]]"


def _seconds(found: dict[str, str], name: str) -> float:
    value = found.get(name, "")
    return float(value) if re.fullmatch(r"\d+(\.\d+)?", value) else 0.0


def _with(base: Script, **changes: Any) -> Script:  # Any: dataclasses.replace's own field values
    return replace(base, **changes)


def judge(prompt: str, base: Script) -> Script:
    """The stand-in as a classifier: yes (p 0.9) when the judged message asks to remember, update or forget."""
    judged = prompt.split("<newest_message>", 1)[1].split("</newest_message>", 1)[0].lower()
    if "[[judge garbage]]" in judged:
        return replace(base, text="maybe?")
    yes = bool(re.search(r"\b(remember|forget|update)\b", judged))
    top = [{"token": "yes", "logprob": math.log(0.9 if yes else 0.1)},
           {"token": "no", "logprob": math.log(0.1 if yes else 0.9)}]
    return replace(base, text="yes" if yes else "no", logprobs=top)


def pick(prompt: str, base: Script) -> Script:
    """The stand-in as a tool picker: options whose name's first word the user message contains."""
    options = re.findall(r"^(\d+)\. ([\w-]+):", prompt.split("</tools>")[0], re.MULTILINE)
    message = prompt.split("<user_message>", 1)[1].split("</user_message>", 1)[0].lower()
    if "[[judge garbage]]" in message:
        return replace(base, text="maybe?")
    picked = [n for n, name in options if name.split("_")[0].lower() in message]
    yes = bool(picked)
    top = [{"token": "yes", "logprob": math.log(0.8 if yes else 0.2)},
           {"token": "no", "logprob": math.log(0.2 if yes else 0.8)}]
    return replace(base, text=("yes" if yes else "no") + "\n" + (", ".join(picked) or "none"), logprobs=top)


_KEEP = re.compile(r"\b(remember|forget|prefer|from now on|keep in mind|call me|my name|i live|i moved|note that"
                   r"|my (?:\w+ ){1,3}(?:is|are)|i am|i'm)\b")  # an ask to keep, or a fact about the user


def memory_ops(messages: list[JsonObject], seed: str) -> tuple[ToolCall, ...]:
    """The stand-in as a memory model: store what the newest user message asks to keep, and
    nothing for a message that asks nothing of the kind (as a model told so would)."""
    users = [m for m in messages if m.get("role") == "user"]
    text = message_text(users[-1]) if users else ""
    lowered = text.lower()
    if re.search(r"\b(yes|sure|ok)\b", lowered) and len(lowered) < 40:  # confirming an offer: keep what was offered
        offer = next((message_text(m) for m in reversed(messages) if m.get("role") == "assistant"), "")
        text = offer
    elif not _KEEP.search(lowered):
        return ()
    key = next((k for w, k in (("prefer", "preference"), ("editor", "editor"), ("live", "location"),
                               ("moved", "location"), ("location", "location"), ("name", "name")) if w in text.lower()),
               "note")
    if re.search(r"\bforget\b", lowered):
        return (ToolCall(_call_id(seed, 0), "delete_memory", orjson.dumps({"key": key}).decode()),)
    value = re.sub(r"^(please\s+)?(remember|note) (that\s+)?", "", text.strip(), flags=re.IGNORECASE)
    return (ToolCall(_call_id(seed, 0), "set_memory", orjson.dumps({"key": key, "value": value}).decode()),)


def _called_since_user(messages: list[JsonObject]) -> set[str]:
    """Tools the assistant already called after the newest user message."""
    names: set[str] = set()
    for message in reversed(messages):
        if message.get("role") == "user":
            break
        for call in message.get("tool_calls") or []:
            if isinstance(call, dict):
                fn = call.get("function", {})
                names.add(str(fn.get("name")))
                if fn.get("name") == "call_tool":  # the tool a generic call reached
                    with contextlib.suppress(orjson.JSONDecodeError, AttributeError):
                        names.add(str(orjson.loads(fn.get("arguments") or "{}").get("name")))
    return names


def _tool_name_for(messages: list[JsonObject], call_id: Json) -> str:
    for message in reversed(messages):
        for call in message.get("tool_calls") or []:
            if isinstance(call, dict) and call.get("id") == call_id:
                return str(call.get("function", {}).get("name", "tool"))
    return "tool"
