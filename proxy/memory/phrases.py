"""What asking to remember, update or forget sounds like, in the 17 languages the gate knows.

Per language: the verbs of keeping (remember, keep in mind, note), of dropping (forget), "don't
forget", being called something, the shapes of an update to a fact about oneself (moved, new
address, no longer), and first-person words (a request to keep something about the user speaks
of the user: "remember that *I*…", while "don't forget to add tests" does not). Written from
general knowledge of each language, never from an evaluation set; `bench/quality.py` reports
the gate on held-out sets.
"""

from __future__ import annotations

import re

# lang: (keep, forget, don't forget, call me, update, first person); "" = none for that language.
_TABLE: dict[str, tuple[str, str, str, str, str, str]] = {
    "en": (r"\b(?:remember|memori[sz]e|keep in mind|bear in mind|note (?:down|this)|make a note|take note|"
           r"save (?:this|that|it) (?:to|in) (?:your )?memory|store (?:this|that) (?:in )?(?:your )?memory|"
           r"add (?:this|that|it) to (?:your )?memory|keep track (?:of )?that)\b",
           r"\bforget\b|\b(?:erase|delete|remove|wipe|clear)\b.{0,30}\b(?:from|in) (?:your )?memory\b",
           r"\b(?:don'?t|do not|never) forget\b",
           r"\b(?:call me|calling me|address me as|refer to me as|speak to me as|i (?:prefer to |like to )?go by|"
           r"you can call me|(?:like|want|prefer|love|'d like) to be called|my name is now|my nickname is)\b"
           r"(?! (?:back|later|when|if|at|on|tomorrow|tonight|a |an |the |asap|whenever|anytime))",
           r"\b(?:i(?:'ve| have)? (?:just )?moved (?:from|to|out|back|away)|i (?:now )?live in .{1,30} now|"
           r"i now (?:live|work|go|use|prefer)|i(?:'m| am) now (?:a|an|vegan|vegetarian|married|divorced|retired|"
           r"working|living|based)|i no longer|i(?:'m| am) no longer|i(?:'m| am| do|) ?(?:not|"
           r"n't)\b.{0,30}\bany ?more|"
           r"my new (?:email|address|number|phone|job|name|title|role|employer|boss|city|partner)(?: \w+)? (?:is|:)|"
           r"i changed my (?:name|email|address|number|phone|job|pronouns|diet)|"
           r"actually,? (?:my (?:name|email|address|"
           r"birthday|age|phone|number|job|title|partner|wife|husband|pronouns|favou?rite|city)|"
           r"i(?:'m| am) (?:a |an )?"
           r"(?:vegan|vegetarian|allergic|based|living|from|\d+))|(?:update|change|correct) (?:my|the) (?:\w+ ){0,2}"
           r"(?:in (?:your )?memory|location|address|name|preference|info|details|profile|email|"
           r"number|birthday|job))",
           r"\b(?:i|i'm|i've|i'd|i'll|my|me|mine|myself)\b"),
    "es": (r"\b(?:recuerda|recuérda|recordá|recuérdalo|acuérdate|ten en cuenta|toma nota|apunta|memoriza|"
           r"guarda en (?:tu )?memoria|guarda (?:esto|eso|que)|guárdalo)", r"\b(?:olvida|olvídate|"
           r"olvídalo|borra)", r"\bno (?:te )?olvides\b",
           r"\b(?:llámame|llamame|puedes llamarme|me llamo ahora)\b",
           r"\b(?:me (?:he )?mudado|me mudé|me cambié de|ahora vivo|ya no (?:soy|vivo|trabajo|como|"
           r"uso|estoy)|mi nuev[oa]|en realidad,? (?:mi|soy)|"
           r"actualiza (?:mi|la))", r"\b(?:yo|mi|mis|me|soy|estoy|tengo|vivo|trabajo|prefiero)\b"),
    "fr": (r"\b(?:souviens-toi|souvenez-vous|rappelle-toi|retiens|retenez|note (?:que|bien)|notez|garde en mémoire|"
           r"mémorise|mémorisez)", r"\b(?:oublie|oubliez|efface|supprime)", r"\bn'oublie(?:z)? pas\b",
           r"\b(?:appelle-moi|appelez-moi|tu peux m'appeler|vous pouvez m'appeler)\b",
           r"\b(?:j'ai déménagé|je ne suis plus|je n'habite plus|je ne travaille plus|mon nouvel? |ma nouvelle|"
           r"j'habite maintenant|maintenant j'habite|en fait,? (?:mon|ma|je)|mets à jour (?:mon|ma))",
           r"\b(?:je|j'|mon|ma|mes|moi|m')"),
    "de": (r"\b(?:merk dir|merke dir|merken sie sich|behalte|behalten sie|notier|speicher(?:e|"
           r"n sie)?,? (?:dass|das|bitte))",
           r"\b(?:vergiss|vergessen sie|lösch)", r"\b(?:vergiss|vergessen sie) (?:nicht|bitte nicht)\b",
           r"\b(?:nenn mich|nenne mich|nennen sie mich|sag .{0,10}zu mir)\b",
           r"\b(?:ich bin .{0,40}(?:umgezogen|gezogen)|ich wohne jetzt|ich arbeite jetzt|"
           r"ich .{0,30}nicht mehr|meine neue|"
           r"mein neuer|mein neues|eigentlich (?:ist|bin) (?:mein|ich)|aktualisiere)",
           r"\b(?:ich|mein\w*|mir|mich)\b"),
    "pt": (r"\b(?:lembr[ea](?:-se|-te)?|grave (?:isso|que)|guarde (?:isso|que)|anote|memorize|tenha em mente)",
           r"\b(?:esqueça|esquece|apague)", r"\bn[ãa]o (?:se )?esque[çc]a\b",
           r"\b(?:me cham[ae] de|pode me chamar|chama-me|chame-me)\b",
           r"\b(?:(?:me )?mudei|agora moro|não (?:sou|moro|trabalho) mais|meu novo|minha nova|"
           r"na verdade,? (?:meu|minha|eu)|"
           r"atualize (?:meu|minha))", r"\b(?:eu|meu|minha|meus|minhas|me|sou|estou|moro|prefiro|"
           r"tenho|gosto|trabalho)\b"),
    "it": (r"\b(?:ricorda|ricordati|tieni a mente|tieni presente|annota|memorizza)", r"\b(?:dimentica|cancella)",
           r"\bnon dimenticare\b", r"\b(?:chiamami|puoi chiamarmi)\b",
           r"\b(?:mi sono trasferit|ora vivo|adesso vivo|non (?:sono|vivo|lavoro) più|il mio nuovo|la mia nuova|"
           r"in realtà,? (?:il mio|la mia|sono)|aggiorna (?:il mio|la mia))",
           r"\b(?:io|mio|mia|miei|mie|mi|sono|ho|vivo|abito|preferisco|lavoro)\b"),
    "nl": (r"\b(?:onthoud|onthou|noteer|sla .{0,20}op in je geheugen)", r"\bvergeet\b", r"\bvergeet niet\b",
           r"\b(?:noem me|noem mij|je mag me .{1,20} noemen)\b",
           r"\b(?:ik ben verhuisd|ik woon nu|ik .{0,30}niet meer|mijn nieuwe|"
           r"eigenlijk is mijn)", r"\b(?:ik|mijn|me|mij)\b"),
    "ru": (r"(?:запомни|запомните|помни,|учти|имей в виду|сохрани в памяти)", r"(?:забудь|забудьте|удали)",
           r"не забудь", r"(?:зови меня|называй меня|называйте меня|обращайся ко мне)",
           r"(?:я переехал|я переехала|теперь я живу|я больше не|мой новый|моя новая|мой новый|на самом деле мо[йя])",
           r"(?<!\w)(?:я|мой|моя|моё|мои|меня|мне|мной)(?!\w)"),
    "tr": (r"\b(?:hatırla|aklında tut|not et|kaydet|unutma\b)", r"\bunut\b", r"",
           r"\b(?:bana .{1,20} de\b|bana .{1,20} diye hitap)",
           r"(?:taşındım|artık\b.{0,40}(?:um|im|ım|üm)\b|yeni (?:adresim|numaram|e-postam|işim))",
           r"(?:\bben\b|\bbenim\b|\bbeni\b|\bbana\b|(?:dığımı|duğumu|diğimi|düğümü|tığımı|tuğumu|tiğimi|tüğümü|"
           r"ımı|imi|umu|ümü)\b|\w+(?:ım|im|um|üm)\b)"),
    "pl": (r"\b(?:zapamiętaj|pamiętaj|zanotuj|zapisz sobie)", r"\bzapomnij\b", r"\bnie zapomnij\b",
           r"\b(?:mów mi|nazywaj mnie|możesz mówić do mnie)\b",
           r"\b(?:przeprowadził(?:em|am) się|teraz mieszkam|już nie (?:jestem|mieszkam|pracuję|jem)|"
           r"mój nowy|moja nowa|"
           r"właściwie mój)",
           r"\b(?:ja|mój|moja|moje|mnie|mi|jestem|mam)\b"),
    "id": (r"\b(?:ingat(?:lah)?|catat|simpan (?:ini|itu) di memori)", r"\blupakan\b", r"\bjangan lupa\b",
           r"\b(?:panggil (?:aku|saya)|sebut (?:aku|saya))\b",
           r"\b(?:(?:sudah|baru) pindah|pindah dari|sekarang (?:aku|saya) tinggal|(?:aku|"
           r"saya) (?:sudah )?tidak .{0,20}lagi|"
           r"(?:alamat|nomor|email) (?:baru|baruku))", r"\b(?:aku|saya|\w+ku)\b"),
    "vi": (r"(?:hãy nhớ|ghi nhớ|nhớ (?:rằng|là|giúp)|nhớ giùm|ghi lại|lưu lại)", r"\bquên\b", r"đừng quên",
           r"(?:gọi (?:tôi|mình|em|tớ) là)",
           r"(?:chuyển (?:từ|đến|vào|ra|sang)|bây giờ (?:tôi|mình) sống|(?:tôi|mình) không còn|"
           r"(?:địa chỉ|số điện thoại|email) mới)", r"(?:tôi|mình|\bem\b|tớ)"),
    "ja": (r"(?:覚えて(?!い[るま])|覚えと|記憶して|メモして|メモしといて)", r"(?:忘れて|削除して|消して)", r"忘れないで",
           r"(?:と呼んで|って呼んで|と呼んでください)", r"(?:引っ越し|今は.{0,10}に住んで|新しい(?:住所|"
           r"メール|電話番号|仕事)|(?:を|に)更新して)",
           r"(?:私|僕|俺|わたし|あたし|自分)"),
    "zh": (r"(?:记住|記住|帮我记|幫我記|记下|記下)", r"(?:忘掉|忘记|忘記|删除|刪除)", r"(?:别忘了|別忘了|不要忘记)",
           r"(?:叫我|称呼我|稱呼我)", r"(?:搬到|搬家|我现在住|我現在住|我不再|更新我的|新(?:的)?(?:地址|邮箱|"
           r"郵箱|电话|電話|手机号)|其实我(?:的|是|"
           r"叫|住)|其實我(?:的|是|叫|住))",
           r"(?:我)"),
    "ko": (r"(?:기억해|기억하고|기억해 ?줘|메모해)", r"(?:잊어|잊어 ?줘|지워)", r"잊지 ?마",
           r"(?:라고 불러|이라고 불러|라고 불러 ?줘)", r"(?:이사했|이사 왔|이사왔|이제.{0,10}살아|"
           r"더 이상 .{0,10}(?:안|않)|새 (?:주소|이메일|번호))",
           r"(?:나는|나|내가|내|저는|저|제가|제)"),
    "ar": (r"(?:تذكر|تذكّر|احفظ|سجل)", r"(?:انس|انسَ|احذف)", r"(?:لا تنس)", r"(?:نادني|ناديني|سمّني|سمني)",
           r"(?:انتقلت|لم أعد|عنواني الجديد|رقمي الجديد|بريدي الجديد|أسكن الآن)", r"(?:أنا|ني\b|ي\b)"),
    "hi": (r"(?:याद रख|याद रखना|याद रखो|नोट कर|सेव कर)", r"(?:भूल जाओ|भूल जाइए|भूल जाना|हटा दो)", r"मत भूलना",
           r"(?:बुलाओ|बुलाइए|बुलाना|कहकर बुला)", r"(?:शिफ्ट हो|चला गया|चली गई|अब मैं .{0,30}(?:रहता|"
           r"रहती|करता|करती)|मैं अब .{0,20}नहीं|मेरा नया|मेरी नई|नया पता)",
           r"(?:मैं|मेरा|मेरी|मेरे|मुझे|मुझ)"),
}


def _compile(pattern: str) -> re.Pattern[str] | None:
    return re.compile(pattern, re.IGNORECASE) if pattern else None


KEEP = {lang: _compile(row[0]) for lang, row in _TABLE.items()}
FORGET = {lang: _compile(row[1]) for lang, row in _TABLE.items()}
DONT_FORGET = {lang: _compile(row[2]) for lang, row in _TABLE.items()}
CALL_ME = {lang: _compile(row[3]) for lang, row in _TABLE.items()}
UPDATE = {lang: _compile(row[4]) for lang, row in _TABLE.items()}
FIRST_PERSON = {lang: _compile(row[5]) for lang, row in _TABLE.items()}
LANGUAGES = frozenset(_TABLE)
# Languages that drop the pronoun ("覚えておいて" is "remember it (about me)"): keep and forget
# need no first-person word.
PRO_DROP = frozenset({"ja", "zh", "ko"})

# A short yes, in any of these languages, and a no (a decline is never a confirmation).
YES = re.compile(
    r"^\W*(?:yes|yeah|yep|yup|sure|ok(?:ay)?|please|please do|go ahead|do it|sounds good|of course|absolutely|"
    r"sí|si|claro|vale|dale|por favor|oui|d'accord|bien sûr|vas-y|volontiers|ja|gerne|klar|bitte|genau|sim|pode|"
    r"certo|com certeza|sì|va bene|volentieri|graag|prima|doe maar|да|конечно|давай|пожалуйста|ага|evet|tabii|olur|"
    r"lütfen|tak|jasne|proszę|oczywiście|ya|iya|boleh|tentu|silakan|vâng|có|được|ừ|dạ|はい|ええ|うん|お願い|いいよ|"
    r"是|是的|好|好的|可以|行|嗯|请|네|예|응|좋아|그래|부탁|نعم|أجل|بالتأكيد|طبعا|حسنا|हाँ|हां|जी|ज़रूर|जरूर|ठीक)",
    re.IGNORECASE,
)
NO = re.compile(r"^\W*(?:no|nope|nah|non|nein|não|nao|нет|hayır|nie|tidak|nggak|không|いいえ|いや|不|别|아니|لا|नहीं|nee)\b",
                re.IGNORECASE)
# The assistant offering to remember something about the user, in any of these languages.
OFFER = re.compile(
    r"remember|keep in mind|memori[sz]e|note (?:that|down)|for next time|for (?:the )?future|in (?:my )?memory|"
    r"recuerde|recordar|recuerdo|próxima vez|retenir|retienne|mémoriser|prochaine fois|merken|nächste mal|"
    r"lembr|próxima vez|ricord|prossima volta|onthoud|volgende keer|запомн|следующ|hatırla|bir dahaki|zapamięt|"
    r"następn|ingat|lain kali|nhớ|lần sau|覚え|記憶|次回|记住|記住|下次|기억|다음을 위해|다음에|أتذكر|تذكر|المرة القادمة|"
    r"याद|अगली बार",
    re.IGNORECASE,
)
# Asking what the assistant remembers, or how memory works: a question, never a request.
RECALL = re.compile(
    r"\b(?:do you|did you|what do you|do you still|how (?:do|can|could|should) (?:i|we|you|one)|how to|why do|"
    r"is it (?:hard|possible|normal)|tips|tricks|ways? to)\b.{0,40}\b(?:remember|recall|memori[sz]e|forget)|"
    r"te acuerdas|recuerdas|tu te souviens|te souviens-tu|vous souvenez-vous|erinnerst du dich|weißt du noch|"
    r"você (?:se )?lembra|ti ricordi|weet je nog|ты помнишь|помнишь|hatırlıyor musun|pamiętasz|kamu ingat|"
    r"bạn có nhớ|覚えてる[?？]|覚えていますか|还记得|還記得|你记得|기억나|기억하니|هل تتذكر|क्या (?:तुम्हें|आपको) याद",
    re.IGNORECASE,
)
# Forgetting a part of the current task ("forget the last paragraph"): an instruction, not memory.
TASK_OBJECT = re.compile(
    r"\b(?:forget|ignore|drop|scrap)\b\s+(?:about\s+)?(?:the|this|these|that|those|it|previous|above|earlier|last)\s+"
    r"(?:\w+\s+)?(?:paragraph|sentence|line|part|section|step|instructions?|version|draft|code|function|question|"
    r"answer|email|message|idea|approach|request|list|example|one|bit|point|change|suggestion)s?\b",
    re.IGNORECASE,
)
# Asking the assistant to do something, in any of these languages: a question with one is a request.
MODAL = re.compile(
    r"\b(?:can you|could you|would you|will you|please|puedes|podrías|peux-tu|pouvez-vous|pourrais-tu|kannst du|"
    r"könntest du|können sie|pode|podes|poderia|puoi|potresti|kun je|kunt u|можешь|можете|не могли бы|misin|mısın|"
    r"musun|müsün|możesz|czy mo|bisa|bisakah|tolong|có thể|được không)\b|くれ|もらえ|ください|能不能|可以|请|請|줄래|주세요|"
    r"줄 수|يمكنك|ممكن|सकते|सकती|सकोगे",
    re.IGNORECASE,
)
# A question in English without its question mark ("what will you call me").
WH_START = re.compile(r"^\W*(?:what|how|which|who|when|where|why|is there|do you know|can you tell me|tell me what|"
                      r"let me know what|i wanna know)\b", re.IGNORECASE)
