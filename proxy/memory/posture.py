"""What the memory gate may skip: turns it is confident are not about memory, in any language.

The gate's posture is inverted: a skipped memory is lost, an extra run is one cheap call, so the
memory model runs for everything but what is clearly something else. Skipped: small talk,
thanks, greetings and acknowledgements; questions (about the world, about the task, about what
the assistant remembers); requests for work (write, explain, fix, translate, find…); code. Run:
everything else (first-person statements, preferences, corrections, standing instructions,
anything in a language these words do not cover), and any skip class that carries a standing
instruction ("from now on", "always", "going forward", in 17 languages) or the assistant's offer
to remember. Written from general knowledge of each language, never from an evaluation set.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from proxy.jsontext import JsonObject
from proxy.memory import phrases
from proxy.messages import message_text
from proxy.tools.gate import conversational

# A standing instruction or a lasting preference: what a request to keep something sounds like
# without the word "remember".
STANDING = re.compile(
    r"\b(?:from now on|going forward|moving forward|in (?:the )?future|next time|(?:for|in) (?:all )?(?:future|later)|"
    r"always|never|by default|whenever|every time|each time|from here on|henceforth|"
    r"i (?:really )?(?:prefer|'d prefer|would prefer|'d rather|would rather|like it when|hate it when|don'?t like|"
    r"dislike|can'?t stand|can'?t eat|don'?t eat|am allergic|'m allergic)|stop (?:using|calling|saying|doing|"
    r"adding|writing|giving)|(?:don'?t|do not) (?:ever )?(?:use|call|say|add|write|give|mention|suggest|recommend)\b|"
    r"ab (?:jetzt|sofort)|in zukunft|künftig|zukünftig|immer|niemals|nie wieder|ich (?:bevorzuge|mag keine?|hasse)|"
    r"a partir de (?:ahora|hoy)|de ahora en adelante|en (?:el )?futuro|siempre|nunca|prefiero|no me gusta|"
    r"à partir de (?:maintenant|aujourd'hui)|désormais|dorénavant|à l'avenir|toujours|jamais|je préfère|je n'aime pas|"
    r"a partir de agora|daqui (?:para|pra) frente|no futuro|sempre|nunca|prefiro|não gosto|"
    r"d'ora in poi|da ora in poi|in futuro|sempre|mai più|preferisco|non mi piace|"
    r"vanaf nu|voortaan|in de toekomst|altijd|nooit|ik heb liever|"
    r"bundan sonra|artık|her zaman|asla|tercih ederim|"
    r"od (?:teraz|dziś)|w przyszłości|zawsze|nigdy|wolę|"
    r"mulai sekarang|ke depannya|selalu|jangan pernah|saya lebih suka|"
    r"từ (?:giờ|nay)|luôn luôn|không bao giờ|tôi thích)\b|"
    r"(?:с этого момента|отныне|впредь|в будущем|всегда|никогда|я предпочитаю|мне не нравится)|"
    r"今後|これからは|いつも|常に|以後|二度と|从现在开始|以后|今后|总是|永远|不要再|앞으로|이제부터|항상|절대|"
    r"अब से|हमेशा|कभी नहीं|من الآن|دائما|دائمًا|أبدا|أفضل",
    re.IGNORECASE,
)
_QUESTION_END = re.compile(r"[?？؟]\W*$")
# Requests for work, in the languages the gate knows: an imperative (or a polite ask) to write,
# explain, fix, find… something; the start of the message (after a greeting or "please").
_WORK = re.compile(
    r"^\W*(?:(?:hi|hey|hello|ok(?:ay)?|so|now|and|also|please|pls|quick(?: question)?|one more thing)[,!.:]?\s+)*"
    r"(?:(?:can|could|would|will) you (?:please )?|please |pls |help me (?:to )?|i need (?:you )?to |"
    r"i(?:'d| would) like (?:you )?to |i want (?:you )?to |let'?s |)"
    r"(?:write|rewrite|draft|compose|create|make|generate|build|design|plan|summari[sz]e|explain|describe|translate|"
    r"fix|debug|refactor|optimi[sz]e|review|check|proofread|edit|improve|correct|convert|calculate|compute|solve|"
    r"find|search|look up|list|give|show|tell|suggest|recommend|compare|analy[sz]e|outline|brainstorm|help|add|"
    r"remove|implement|code|test|format|sort|shorten|expand|simplify|paraphrase|rephrase|reword|continue|finish|"
    r"complete|answer|teach|walk me through|show me|name|define|estimate|predict|classify|extract|turn|"
    r"export|download|upload|copy|paste|print|run|install|deploy|commit|push|"
    r"schreib\w*|erklär\w*|übersetz\w*|fass\w* .{0,30}zusammen|hilf|zeig|gib|mach|erstell\w*|finde|korrigier\w*|"
    r"escribe|explica|traduce|resume|ayúdame|dame|muéstrame|haz|crea|busca|corrige|"
    r"écris|explique|tradui[st]|résume|aide-moi|donne|montre|fais|crée|cherche|corrige|"
    r"escreva|explique|traduza|resuma|me ajude|ajude-me|dê|mostre|faça|crie|procure|corrija|"
    r"scrivi|spiega|traduci|riassumi|aiutami|dammi|mostrami|fai|crea|cerca|correggi|"
    r"schrijf|leg uit|vertaal|vat samen|help me|geef|laat zien|maak|zoek|"
    r"напиши|объясни|переведи|помоги|дай|покажи|сделай|создай|найди|исправь|"
    r"yaz|açıkla|çevir|özetle|yardım et|göster|oluştur|bul|düzelt|"
    r"napisz|wyjaśnij|przetłumacz|streść|pomóż|pokaż|zrób|stwórz|znajdź|popraw|"
    r"tulis|jelaskan|terjemahkan|ringkas|bantu|tunjukkan|buat|cari|perbaiki|"
    r"viết|giải thích|dịch|tóm tắt|giúp|cho tôi|tạo|tìm|sửa)\b",
    re.IGNORECASE,
)
# The same in scripts without word boundaries: a polite request for work at the end or start.
_WORK_CJK = re.compile(
    r"(?:書いて|教えて|説明して|翻訳して|まとめて|作って|直して|探して|見せて|調べて|考えて|ください|下さい)|"
    r"(?:^\W*(?:请|請|帮我|幫我|给我|給我|写|寫|解释|解釋|翻译|翻譯|总结|總結|告诉我|告訴我))|"
    r"(?:써 ?줘|써 ?주세요|설명해|번역해|요약해|알려 ?줘|알려 ?주세요|만들어|찾아 ?줘|보여 ?줘|도와 ?줘|고쳐)|"
    r"(?:^\W*(?:اكتب|اشرح|ترجم|لخص|ساعدني|أعطني|اعطني|أرني|ابحث)|(?:लिखो|लिखें|समझाओ|समझाइए|अनुवाद करो|बताओ|बताइए|"
    r"दिखाओ|बनाओ|ढूंढो|मदद करो))",
)
_LEAD = r"^\W*(?:(?:hi|hey|hello|ok(?:ay)?|so|and|also|but|please|pls|um+|hmm+|quick question)[,!.:]?\s+)*"
# A question without its question mark ("are there any shots i should get", "is it safe to…").
_ASKS = re.compile(_LEAD + r"(?:are|is|am|was|were|do|does|did|can|could|will|would|should|shall|has|have|had|may|"
                   r"might|must|any|anything)\s+(?:i|you|my|the|it|there|we|they|this|that|these|those|he|she|a|an|"
                   r"any|your|our|his|her|their|me|us|someone|anyone)\b", re.IGNORECASE)
# Wanting something done or had ("i need to book…", "i'd like a table", "tell me…", "cancel that"):
# a request to act or answer, not something to keep.
_WANTS = re.compile(
    _LEAD + r"(?:i (?:really )?(?:need|want|wanna|would like|'d like|wish|am looking|'m looking|am trying|'m trying|"
    r"have to|gotta)(?: you)?(?: to| for| a| an| the| some| my| help| more| another)\b|i'd like (?:to|a|an|the|some)\b|"
    r"let me know|tell me|remind me|how (?:about|come)|let (?:the |my |our )?\w+(?: \w+)? know\b|"
    r"(?:cancel|reserve|book|order|buy|send|text|play|turn|put|get|go|roll|flip|share|schedule|pay|transfer|whisper|"
    r"speak|read|open|close|start|stop|pause|resume|skip|repeat|mute|unmute|increase|decrease|lower|raise|check|"
    r"confirm|track|report|request|apply|block|freeze|unfreeze|dial|email|message|navigate|delete|clear|undo|redo|"
    r"shut|switch|pick|choose|rate|count|spell|define|convert|set up|look|take|grab|fetch|visit|click|scroll)\b)",
    re.IGNORECASE,
)
_CODE = re.compile(r"```|^\s*(?:def|class|function|import|from|const|let|var|public|private|#include|SELECT|"
                   r"INSERT|UPDATE|CREATE TABLE)\b|Traceback \(most recent|\w+Error:|;\s*$|\{\s*$|=>|</\w+>",
                   re.IGNORECASE | re.MULTILINE)


def _keeps(text: str) -> bool:
    return any((p := table.get(lang)) is not None and p.search(text) is not None
               for table in (phrases.KEEP, phrases.FORGET, phrases.DONT_FORGET) for lang in phrases.LANGUAGES)


def about_the_task(text: str) -> bool:
    """"Don't forget to add tests", "forget the last paragraph": keeping or dropping part of the
    task (the gate has already found no request about the user in it)."""
    return any((p := table.get(lang)) is not None and p.search(text) is not None
               for table in (phrases.DONT_FORGET, phrases.FORGET) for lang in phrases.LANGUAGES)


_DECLINE_REST = re.compile(
    r"^\W*(?:(?:thanks?|thank you|thx|merci|danke|gracias|obrigad[oa]|grazie|bedankt|спасибо|teşekkürler|dzięki|"
    r"makasih|cảm ơn|ありがとう|谢谢|고마워|شكرا|धन्यवाद)|(?:that'?s|it'?s) (?:fine|ok(?:ay)?|alright)|not (?:now|needed|"
    r"necessary)|no need|i'?m good|never ?mind|(?:don'?t|do not) (?:bother|save|remember|store|keep)(?: (?:that|it|this))?|"
    r"(?:that'?s )?all good|maybe later)?\W*$",
    re.IGNORECASE,
)


def declines(text: str) -> bool:
    """A bare no, or a no with thanks or "don't save that" (not "no, it's Maria": a correction)."""
    found = phrases.NO.search(text)
    return found is not None and bool(_DECLINE_REST.match(text[found.end():]))


def standing(text: str) -> bool:
    """A standing instruction or lasting preference ("from now on…", "I'd rather…", "always…")."""
    return bool(STANDING.search(text))


def offered(context: Sequence[JsonObject]) -> bool:
    """The assistant's last words offered to remember something (a question: "shall I remember…?";
    "noted, I'll remember that" offers nothing)."""
    return any(m.get("role") == "assistant" and phrases.OFFER.search(message_text(m))
               and any(mark in message_text(m) for mark in "?？؟") for m in context[-2:])


def skip_class(text: str, context: Sequence[JsonObject] = (), quoted: str = "") -> str | None:
    """The class of a turn the gate is confident is not about memory (small_talk, question, work,
    code, quote), or None: the memory model should run. A standing instruction, or a reply to an
    offer to remember, is never skipped. `quoted`: the message as written, when `text` is it with
    quoted speech taken out (words of keeping only inside quotes are someone else's)."""
    if declines(text):
        return "small_talk"  # a bare no, or a no to an offer (a no followed by a fact is a correction: run)
    if quoted and _keeps(quoted) and not _keeps(text):
        return "quote"  # "my grandfather always said 'remember who you are'"
    if standing(text) or offered(context):
        return None
    if conversational(text):
        return "small_talk"
    if _QUESTION_END.search(text) or (phrases.WH_START.search(text) and not phrases.MODAL.search(text)):
        return "question"
    if phrases.RECALL.search(text) or _ASKS.search(text):
        return "question"
    if _WORK.search(text) or _WORK_CJK.search(text) or _WANTS.search(text) or about_the_task(text):
        return "work"
    if _CODE.search(text):
        return "code"
    return None
