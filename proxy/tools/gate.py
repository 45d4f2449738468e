"""The embedded needs-tool gate: does this turn need any tool at all?

Costs are asymmetric (a withheld tool fails a task, an extra one costs a few hundred tokens),
so the gate says "no tool" only where it is confident: small talk in 17 languages, creative
writing, opinions, follow-ups and why/what-is questions. A request to act (a path, URL, id,
"near…", an action verb on a thing, a question about now: "current", "latest", "today") always
gets tools, and so does a turn in any language but
English unless it is clearly one of those. In between, a small logistic model over the ranking's
raw top score and the message's shape decides; with the `local` backend also the model's
cosines to the nearest tools and to built-in example turns, in units of that model's own cosine
scale. Its weights are fitted by `bench/fit_gate.py` on public fit halves (bench/splits.py);
`bench/quality.py` reports the gate on held-out sets.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from proxy.tools.caseless import Caseless
from proxy.tools.text import TEXT_CACHE, clauses, language, turn_terms

TASK = re.compile(
    r"^\s*(write|create (a|an) (story|poem|list|short|essay|song|haiku)|make (a|an) (list|story|poem)|rank|parse|given|"
    r"generate|rewrite|summari[sz]e|classify|explain|describe|compose|edit|identify|convert|answer|tell me (a|about)|"
    r"name|list|give me|suggest|design|come up with|solve|translate|correct|paraphrase|rephrase|categori[sz]e|extract|"
    r"sort|calculate|find the|brainstorm|draft|outline|analy[sz]e|compare|evaluate|determine|provide (a|an)|create a|"
    r"construct|formulate|how would you|imagine|pretend|read the|consider|choose|select|fill|complete|improve|reword|"
    r"detect|decide|predict|estimate)\b",
    re.IGNORECASE,
)
KNOWLEDGE = re.compile(
    r"^\s*(why|how (do|does|did|can|is|are|would|could|should|to|many|much)|what (is|are|was|were|does|do|would|makes|"
    r"happens|causes)|who (is|was|wrote|were|invented)|when (did|was|is)|is it|is there|are there|do you|does|can a|"
    r"can you explain|what's the difference|which is)\b",
    re.IGNORECASE,
)
REQUEST = Caseless(re.compile(
    r"\b(i need|i want|i'?m looking|i am looking|i'?d like|i would like|can you (find|show|get|search|check|fetch|book|"
    r"recommend|help|provide|tell me where|look)|could you (find|show|get|search|check|fetch|book|recommend|help|provide)|"
    r"help me (find|get|book|search|with)|show me|find me|look up|search for|please (find|show|get|search|check))\b",
    re.IGNORECASE,
))
LIVE = Caseless(re.compile(
    r"\b(current|currently|latest|today|tonight|now|recent|recently|live|nearby|near me|price|prices|pricing|weather|"
    r"news|trending|stock|stocks|schedule|available|deals?|discounts?|book|booking|reserve|order|buy|purchase|tickets?|"
    r"upcoming|this week|tomorrow|real-time|forecast|score|scores|my)\b",
    re.IGNORECASE,
))

_CONVERSATIONAL = re.compile(
    r"^\s*(?:(?:ok(?:ay)?|k|cool|great|nice|perfect|awesome|thanks?(?: you)?|thank you(?: so much| very much)?|thx|ty|"
    r"cheers|got it|sounds good|sure|yes|yep|yeah|no|nope|hi|hello|hey|good (?:morning|evening|night|afternoon)|"
    r"bye|goodbye|see you|lol|haha|wow|that(?:'s| is| was) (?:\w+ )?(?:great|helpful|perfect|awesome|useful|nice|it)|"
    r"(?:that|this) (?:was|is) (?:really |very |super )?(?:helpful|useful|great|good)|"
    r"you(?:'re| are) (?:the best|great|awesome)|never ?mind|all good|no worries|np)"
    r"[\s,.!?:;)(-]*)+$",
    re.IGNORECASE,
)
# Thanks, greetings and acknowledgements in the languages Keel knows (the start of the message).
_SMALL_TALK = re.compile(
    r"^\W*(?:thanks|thank you|thx|ty|cheers|hi|hello|hey|good (?:morning|evening|night|afternoon)|bye|great|awesome|"
    r"perfect|nice|cool|ok(?:ay)?|got it|makes sense|danke|vielen dank|hallo|guten (?:morgen|tag|abend)|tschüss|super|"
    r"gracias|muchas gracias|hola|buen(?:os|as) (?:días|tardes|noches)|vale|genial|perfecto|merci|bonjour|bonsoir|salut|"
    r"parfait|génial|obrigad[oa]|olá|oi|bom dia|boa (?:tarde|noite)|perfeito|grazie|ciao|buongiorno|perfetto|"
    r"dank je|dankjewel|bedankt|hoi|goedemorgen|ありがとう|どうも|こんにちは|おはよう|こんばんは|了解|謝謝|谢谢|多谢|你好|您好|"
    r"早上好|好的|감사|고마워|고맙|안녕|спасибо|привет|здравствуй|отлично|понятно|teşekkür|sağ ?ol|merhaba|dziękuję|"
    r"dzięki|cześć|dzień dobry|terima kasih|makasih|halo|selamat|cảm ơn|xin chào|chào|شكرا|مرحبا|السلام عليكم|"
    r"धन्यवाद|शुक्रिया|नमस्ते)",
    re.IGNORECASE,
)
# Goodbyes: "that's all for today", "see you tomorrow", "I'm done for the day", "have a great
# weekend", "thanks for the help today". Their time words say when the user leaves, not what they
# ask about; a message that is nothing but these and small talk is small talk (`conversational`).
_WHEN = (r"(?:now|today|tonight|for (?:now|today|tonight|the (?:day|night|week|weekend|moment))|the day|this "
         r"(?:morning|afternoon|evening|week|weekend)|tomorrow|later|soon|next (?:time|week|month)|"
         r"on (?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)|monday|tuesday|wednesday|thursday|"
         r"friday|saturday|sunday)")
_SIGN_OFF = Caseless(re.compile(
    r"\b(?:(?:that(?:'s| is|'ll be| will be| was)|this is) (?:all|it|everything)(?: (?:i|we) (?:need(?:ed)?|wanted))?|"
    r"(?:i'?m|i am|we'?re|we are) (?:done|finished|all set|off|signing off|logging off)|"
    r"(?:that'?s |that is )?enough|signing off|logging off|"
    r"(?:see|talk to|speak to|catch|chat with) you|(?:talk|speak|chat) (?:to you )?(?=later|soon|tomorrow)|"
    r"(?:have|enjoy) (?:a |the )?(?:good|great|nice|lovely|wonderful|relaxing) (?:day|evening|night|weekend|week|"
    r"one|rest of (?:the|your) (?:day|week|evening))|good ?night|"
    r"(?:thanks?|thank you)(?: (?:so|very) much)? for (?:all )?(?:the|your) (?:help|time|work|support))"
    rf"(?:,? (?:{_WHEN}|(?:all )?(?:for )?(?:{_WHEN})))*(?![\w'’])",
    re.IGNORECASE,
))

# A request to act, in any language: a path, a URL, a repository, ticket, issue, channel or object
# id, a place to look near. Such a turn always gets the ranked tools, whatever else it says.
_ACT_SIGNAL = Caseless(re.compile(
    r"(?:^|[\s'\"(`])(?:~|\.{1,2})?/[\w.\-]+|\b[A-Za-z]:\\|"
    r"\b[\w\-]+\.(?:py|js|ts|tsx|jsx|md|txt|json|ya?ml|csv|toml|log|conf|cfg|ini|html?|css|pdf|png|jpe?g|gif|svg|"
    r"sh|go|rs|java|rb|sql|xml|env|lock|docx?|xlsx?|zip)\b|"
    r"https?://|\bwww\.|\b[\w\-]+\.(?:com|org|net|io|dev|app|ai|co|de|fr|es|uk|jp|cn|gov|edu)\b|"
    r"\b(?!(?:and|or|he|she|his|him|her|yes|true|km|miles|per|w|s)/)[A-Za-z][\w.\-]*/[\w.\-]*[A-Za-z0-9]\b|"
    r"\b[A-Z][A-Z0-9]{1,9}-\d+\b|(?<![\w&])#\d+\b|(?<![\w&])#[a-z][\w\-]+|"
    r"\b(?:PR|pr|issue|ticket|pull request)\s*#?\d+\b|\b[a-z]{2,6}_[A-Za-z0-9]{6,}\b|"
    r"\b(?:current(?:ly)?|latest|right now|today'?s?|tonight|live|real[- ]?time|up[- ]to[- ]date|"
    r"this (?:week|weekend|month)|tomorrow'?s?|upcoming|forecast)\b|"
    r"\b(?:use|using) (?:a|an|the|your|some) [\w\- ]{0,30}(?:tool|generator|calculator|api|plugin|engine|"
    r"database|service|app)\b|"
    r"\b(?:show|display|find|get|provide|send|generate|draw|plot)\b[^.?!]{0,40}\b(?:images?|pictures?|photos?|"
    r"videos?|gifs?|graphs?|charts?|maps?|plots?)\b|"
    r"\bnear(?:by)?\b|\baround (?:me|here)\b|\bclosest\b|cerca de|près d|in der nähe|perto d|vicino a|in de buurt|"
    r"近く|附近|근처|рядом|около|yakın|blisko|dekat|gần|"
    r"^\W*(?:(?:now|then|also|and|so|ok(?:ay)?|next|first)\W+)?(?:please\s+|can you\s+|could you\s+|would you\s+|"
    r"kindly\s+)?(?:open|read|download|upload|delete|remove|"
    r"merge|push|commit|deploy|execute|send|post|reply|fetch|look up|move|rename|copy|assign|close|cancel|refund|"
    r"scale|restart|restore|install|navigate|click|go to|book|schedule|star|fork|invite|archive|clone|roll ?back|"
    r"retry|trigger|publish|notify|ping|dm|mark|resolve|reopen|transition|attach|pull up|bring up|submit|tail|"
    r"create (?:a |an |the )?(?:new )?(?:branch|issue|ticket|page|folder|directory|file|repo|repository|pull|pr|"
    r"project|customer|invoice|task|channel|release|tag|label|sprint|milestone|cycle|webhook|document|database|"
    r"table|bucket|migration|deployment|pod|namespace|team|user|product|price|coupon|refund|payment|subscription)|"
    r"make (?:a |an |the )?(?:new )?(?:folder|directory|branch|file|repo|ticket|issue|page))\b",
    re.IGNORECASE,
))
# What a model writes or knows without a tool; a match keeps the turn on the no-tool side unless
# it also carries an act signal.
_OWN_WORK = Caseless(re.compile(
    r"\b(?:poem|story|haiku|joke|essay|limerick|song|lyrics|slogan|tagline|sonnet|riddle|rhyme|metaphor|analogy|"
    r"cover letter|speech|toast|bio|dialogue|fairy tale|fable|pun|synonyms?|antonyms?)\b|"
    r"^\W*(?:what do you think|do you think|in your opinion|i think|i feel|i believe|honestly|imho|lol|haha|"
    r"can you explain|could you explain|explain (?:that|this|it|again|why)|what do you mean|why did you|"
    r"i don'?t (?:understand|get it)|could you elaborate|elaborate|say that again|in simpler terms|"
    r"what(?:'s| is) your (?:favou?rite|opinion)|tell me a (?:joke|story|fun fact)|tell me about yourself)\b|"
    r"gedicht|geschichte|witz|poema|cuento|chiste|poème|histoire|blague|poesia|storia|barzelletta|piada|gedicht|"
    r"詩|物語|冗談|ジョーク|诗|故事|笑话|시를|이야기|농담|стих|сказк|шутк|"
    r"^\W*(?:warum|wieso|was ist|wie funktioniert|por qué|qué es|cómo funciona|pourquoi|qu'est-ce que|"
    r"comment fonctionne|perché|cos'è|come funziona|por que|o que é|como funciona|waarom|wat is|hoe werkt|почему|"
    r"что такое|как работает|neden|nedir|dlaczego|co to jest|mengapa|apa itu|tại sao|لماذا|ما هو|क्यों)|"
    r"なぜ|とは|って何|为什么|什么是|為什麼|왜|이란|무엇인가",
    re.IGNORECASE,
))


# A question about a concept of the tools' domain, asked to learn, not to act ("what is a liveness
# probe for?", "what's the difference between a Deployment and a StatefulSet?", "how does keyword
# difficulty get calculated?"): a generic subject (an article, a bare term, "someone"), never the
# user's things ("my", "this", "it") or the world as it is now (`acts` wins over it).
_GENERIC = (r"(?!(?:it|its|this|that|these|those|my|our|your|his|her|their|there|here|the|going|happening|new|"
            r"wrong|left|next|up|on|in|at|today|now|currently|latest|open|running|failing|pending|due|changed|"
            r"taking|using|causing|blocking|broken|inside|in there)\b)")
_EXPLAINS = re.compile(
    r"^\W*(?:(?:so|ok(?:ay)?|and|but|hmm+|quick question|just curious|out of curiosity|genuine question)[,:.!]?\s+)?"
    r"(?:(?:can|could) you |please )?(?:"
    r"what(?:'s| is| are| was| were)\s+(?:a|an)\s|"
    rf"what(?:'s| is| are)\s+{_GENERIC}[\w\-]+(?:\s+[\w\-]+){{0,5}}\s*(?:\bfor\b|,|\?|$|\b(?:in|on) (?:simple|plain|general|short)|"
    r"\bconceptually|\bexactly|\bactually|\bin \w+(?:\s\w+)?\??$)|"
    r"what(?:'s| is| are) the (?:differences?|point|purpose|meaning|role|idea|benefits?|advantages?|downsides?|"
    r"trade-?offs?|use) (?:of|between|in|for)\b|"
    r"what (?:does|do) (?:a |an |the )?[^?\s]+(?:\s+[^?\s]+){0,5} (?:mean|stand for|do)\b(?! (?:to|with|in) (?:my|our|it|this))|"
    r"how (?:does|do|is|are|would|can) (?:a |an |the )?[\w\-]+(?:\s+[\w\-]+){0,5}\s+(?:work|differ|different|compare|"
    r"happen|calculated|computed|decided|determined|measured|defined|get (?:calculated|computed|decided|determined))\b|"
    r"how (?:do|does|would|should) (?:people|teams|companies|developers|one|someone|you) (?:usually |typically |normally )?\w+|"
    r"why (?:would|do|does|should|might|did|is it that) (?:someone|anyone|people|teams|companies|developers|one|"
    r"you|i|we) (?:ever |usually |typically |normally |even |bother |want to |use |choose |need )|"
    r"why (?:use|bother|choose|is it called|are they called)\b|"
    r"explain (?:what|how|why|when|the difference|the concept|the idea|in simple terms|like)\b|"
    r"explain (?:a |an )?[\w\-]+(?:\s+[\w\-]+){0,4} (?:vs\.?|versus|compared (?:to|with)|to me)\b|"
    r"when (?:should|would|do|does) (?:i|we|you|one|people|teams) (?:use|pick|choose|prefer)\b|"
    r"is (?:it|there) (?:better|worse|a difference|any difference)\b|"
    r"(?:roughly|in general|generally|conceptually),? (?:how|what|why)\b|"
    r"(?:how|what|why|when|which|is|are|do|does|can)\b[^?]{3,120}\b(?:in general|generally|usually|typically|"
    r"in theory|conceptually|in principle)\W*$|"
    # the other languages Keel's glossary reads
    r"¿?\s*(?:qué (?:es|son|significa)|cuál es la diferencia|para qué sirve|cómo funciona)\b|"
    r"(?:was (?:ist|sind) (?:ein|eine|der unterschied|eigentlich)|was bedeutet|wie funktioniert|wozu (?:dient|braucht))\b|"
    r"(?:qu'est-ce qu|c'est quoi|quelle est la différence|à quoi sert|comment fonctionne)|"
    r"(?:o que (?:é|são|significa)|qual (?:é )?a diferença|para que serve|como funciona)\b|"
    r"(?:cos'è|che cos'è|qual è la differenza|a cosa serve|come funziona)|"
    r"(?:wat is (?:een|het verschil)|waarvoor dient|hoe werkt)\b|"
    r"(?:что такое|в чём разница|в чем разница|зачем нужн|как работает)"
    r")"
    r"|とは|って何|の違い|什么是|是什么意思|的区别|有什么区别|란 무엇|이란 무엇|차이점|차이가 뭐",
    re.IGNORECASE,
)
# A follow-up leans on the turns before: a pronoun or "the first one" for an object of the earlier
# turns, "same", "again", "there", or an elliptic start ("and close it", "now for staging").
_LEANS = Caseless(re.compile(
    r"\b(?:it|its|that|this|those|these|them|there|same|again|instead|too|"
    r"the (?:first|second|third|fourth|last|latest|other|previous|next|former|latter|top|bottom|new|old|"
    r"\w+(?:-\w+)?) (?:one|ones)|(?:first|second|third|last|other) one|both|either|each of (?:those|them))\b|"
    r"^\W*(?:and|now|then|also|next|ok(?:ay)?,? (?:now|then|so)|same (?:for|with|but)|what about|how about)\b|"
    r"\b(?:lo|la|los|las|eso|esa|ese|esto|también|otra vez|es|das|dies|den|dem|auch|nochmal|wieder|"
    r"le|ça|cela|celui|celle|aussi|encore|isso|isto|também|de novo|lo|quello|quella|anche|ancora)\b|"
    r"(?:^|\s)(?:и|а|теперь|его|её|их|это|тоже|снова)(?:\s|$)|"
    r"それ|これ|あれ|その|この|同じ|もう一度|它|这个|那个|这|那|同样|再|그거|이거|그것|이것|같은|다시",
    re.IGNORECASE,
))
FOLLOW_UP_WORDS = 8  # a message this short after a turn that acted is read as part of that task
# The user's own things: a question about them is about their data, not a concept.
_MINE = Caseless(re.compile(r"\b(?:my|our|mine|ours|mi|mis|nuestr[oa]s?|mein\w*|unser\w*|mon|ma|mes|notre|nos|meu|minha|"
                   r"nosso|nossa|mio|mia|miei|nostro|nostra|mijn|onze)\b|(?:^|\s)(?:мой|моя|моё|мои|наш\w*)(?:\s|$)|"
                   r"私の|僕の|俺の|我的|我们的|내 |제 |우리", re.IGNORECASE))


@lru_cache(maxsize=TEXT_CACHE)
def explains(text: str) -> bool:
    """A question about a concept, asked to learn, not to act (any act signal wins: `acts`)."""
    return bool(_EXPLAINS.search(text)) and not _MINE.search(text) and not acts(text)


def follow_up(text: str, acted: bool) -> bool:
    """Does the newest message continue a task the turns before acted on ("close it", "what is it
    logging?", "now for staging")? Small talk, a concept question or the model's own work never."""
    if not acted or not text.strip() or conversational(text) or explains(text) or own_work(text):
        return False
    return bool(_LEANS.search(text)) or len(text.split()) <= FOLLOW_UP_WORDS


@lru_cache(maxsize=TEXT_CACHE)
def conversational(text: str) -> bool:
    """Thanks, greetings, acknowledgements, goodbyes ("thanks, that fixed it!", "danke!", "谢谢",
    "that's all for today!"): turns that need no tool whatever they share in words, unless they
    also ask something or name something to act on."""
    if not text.strip() or _CONVERSATIONAL.match(text):
        return True
    rest = _SIGN_OFF.sub(" ", text)
    if rest != text:  # a goodbye: what else the message says decides
        rest = re.sub(r"^[\W_]+", "", rest)
        return "?" not in text and (not rest or conversational(rest))
    match = _SMALL_TALK.match(text)
    if not match or acts(text) or "?" in text or "？" in text:
        return False
    rest = text[match.end():]
    if match.group()[-1].isascii() and rest[:1].isalnum():
        return False  # "hi" of "hiking"
    return not REQUEST.search(rest) and not re.search(
        r"\b(?:now|next|also|but|can|could|please|pls|let'?s|then|and)\b", rest, re.IGNORECASE) and len(rest.split()) <= 12


@lru_cache(maxsize=TEXT_CACHE)
def acts(text: str) -> bool:
    """A request to act: a path, URL, id, "near…", an action verb that works on something, a
    question about the world as it is now ("current", "latest", "today", "live"…), which no
    model knows without looking, an ask to use a tool ("use a random number generator"), or one
    for images, charts or maps."""
    return any(_ACT_SIGNAL.search(clause) for clause in clauses(text))


@lru_cache(maxsize=TEXT_CACHE)
def own_work(text: str) -> bool:
    """Creative writing, opinion, a follow-up about an answer, or a why/what-is question."""
    return bool(_OWN_WORK.search(text))


# intercept, top/10, top/terms, task, knowledge, request, live/3, words/60, multi-line, small talk,
# task*top/10, request*top/10 (fitted by bench/fit_gate.py on public fit halves)
WEIGHTS = (-2.258, 1.553, 1.359, -0.946, -0.784, 1.005, 0.461, -0.342, -0.458, -0.839, -0.411, 0.662)


def features(text: str, top_score: float) -> list[float]:
    top = top_score / 10
    n_terms, task, knowledge, request, live, words, lines, small_talk = _shape(text)
    return [1.0, top, top_score / max(1, n_terms), task, knowledge, request, live, words, lines, small_talk,
            task * top, request * top]


@lru_cache(maxsize=TEXT_CACHE)
def _shape(text: str) -> tuple[int, float, float, float, float, float, float, float]:
    """The features of the text alone (computed once per text)."""
    return (len(turn_terms(text)), float(bool(TASK.match(text))), float(bool(KNOWLEDGE.match(text))),
            float(bool(REQUEST.search(text))), min(3, LIVE.count(text)) / 3,
            min(60, len(text.split())) / 60, float("\n" in text.strip()), float(conversational(text)))


# Turns that need a tool and turns that do not, for the local model's gate: a turn close in
# meaning to the first kind more than to the second likelier needs a tool, whatever the catalog.
# Written for Keel, generic on purpose (none is taken from an evaluation set).
NEEDS_TOOL_EXAMPLES = (
    "What's the weather in Berlin right now?", "Book a table for two at an Italian restaurant tonight.",
    "Find flights from London to New York next Friday.", "What is Apple's stock price today?",
    "Show me the latest news about the election.", "Send a message to the team channel saying the build is fixed.",
    "Create a new branch in my repository.", "Look up the reviews for this hotel.",
    "Search the web for the newest iPhone release date.", "Order a large pepperoni pizza for delivery.",
    "Check my calendar for meetings tomorrow.", "Convert 100 US dollars to euros at today's rate.",
    "Find a nearby pharmacy that is open now.", "Get the directions from my office to the airport.",
    "What are the trending topics on Twitter today?", "Read the file report.txt and tell me what it says.",
    "List the open issues in our project.", "Track my package with this tracking number.",
    "Play some relaxing jazz music.", "Buy tickets for the concert on Saturday.",
    "Find the cheapest parking garage near the stadium.", "What movies are showing at the cinema this weekend?",
    "Check whether my server at example.com is up.", "Add milk and eggs to my shopping list.",
    "Translate and download the subtitles for this YouTube video.",
)
NO_TOOL_EXAMPLES = (
    "Write a short poem about the sea.", "Explain how photosynthesis works.",
    "What is the difference between a virus and a bacterium?", "Summarize the following paragraph in one sentence.",
    "Translate this sentence into French.", "Give me three ideas for a birthday party theme.", "Why do cats purr?",
    "Rewrite this email so it sounds more polite.", "What does the word ephemeral mean?",
    "Tell me a joke about programmers.", "How do I stay motivated when studying?",
    "Compose a limerick about a lazy dog.", "What are the pros and cons of remote work?",
    "Who wrote Pride and Prejudice?", "Describe the plot of Hamlet in a few lines.", "Solve 2x + 3 = 11.",
    "Brainstorm names for a coffee shop.", "Is it better to rent or buy a house, in general?",
    "What would a good first sentence for a novel be?", "Pretend you are a pirate and greet me.",
    "Help me outline an essay on climate change.", "Classify these words as nouns or verbs.",
    "What causes the seasons on Earth?", "Give me advice on how to be a better listener.",
    "Draft a thank-you note for my colleague.",
)

# The same features plus the local model's evidence, in units of the model's own cosine scale
# (GateExamples: spreads of the example turns' pairwise cosines from their mean, so any model
# reads alike): the best five cosines to the catalog's tools (top, top - 5th, mean) and the margin
# between the turn's closeness to the needs-tool and the no-tool examples (best three each).
SEMANTIC_WEIGHTS = (-4.004, 0.728, 0.773, -0.730, -0.682, 0.827, 0.203, -0.176, -0.257, -0.547, -0.453, 0.502,
                    0.605, -0.151, 0.616, 0.913)


@dataclass(frozen=True)
class SemanticEvidence:
    cosines: Sequence[float]  # the best cosines to the catalog's tools, best first, on the model's scale
    example_margin: float  # closeness to NEEDS_TOOL_EXAMPLES minus closeness to NO_TOOL_EXAMPLES, same units


def semantic_features(text: str, top_score: float, evidence: SemanticEvidence) -> list[float]:
    """`features` plus the local model's evidence."""
    top5 = list(evidence.cosines[:5]) or [0.0]
    return [*features(text, top_score), top5[0], top5[0] - top5[-1], sum(top5) / len(top5), evidence.example_margin]


def needs_tool_probability(top_score: float, text: str, evidence: SemanticEvidence | None = None) -> float:
    """P(the turn needs a tool), on the safe side: small talk is 0; a request to act is at least
    ACT_FLOOR; a turn in a language whose shapes the weights were not fitted on (anything but
    English) is at least UNKNOWN_FLOOR unless it is clearly the model's own work. `evidence`:
    the local model's, when the ranking has it."""
    if conversational(text):
        return 0.0
    if evidence is None:
        pairs = zip(WEIGHTS, features(text, top_score), strict=True)
    else:
        pairs = zip(SEMANTIC_WEIGHTS, semantic_features(text, top_score, evidence), strict=True)
    p = 1 / (1 + math.exp(-sum(w * x for w, x in pairs)))
    if acts(text):
        return max(p, ACT_FLOOR)
    if explains(text):
        return min(p, EXPLAIN_CEILING)
    if own_work(text):
        return p
    return max(p, UNKNOWN_FLOOR) if language(text) != "en" else p


ACT_FLOOR = 0.9
UNKNOWN_FLOOR = 0.6
EXPLAIN_CEILING = 0.3  # a concept question: the model's own knowledge, unless it names something to act on
FOLLOW_UP_FLOOR = 0.6  # a follow-up of a turn that acted (`follow_up`, read by the planner with the window)
