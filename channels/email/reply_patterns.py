"""What mail clients write around a reply, per client and language: the tables the reply-text
extractor (`channels.email.quote`, `channels.email.signature`) applies. Only data lives here.

Each entry names the client and the language it comes from; the tests hold a real-looking mail
for every entry (`tests/channels/test_email_reply_text.py` fails when an entry matches none).
The tables complement mail-parser-reply's quote headers and the forward parser's header labels
(`channels.email.forward_patterns`), which the extractor uses as well.
"""

# The patterns are localized literals (full-width colons, dotless i) and long by nature.
# ruff: noqa: RUF001, E501

from __future__ import annotations

import re
from collections.abc import Sequence

Patterns = tuple[re.Pattern[str], ...]


def _compile(patterns: Sequence[str]) -> Patterns:
    return tuple(re.compile(pattern, re.I) for pattern in patterns)


# --- attribution lines ("On … wrote:"), matched on the line(s) joined with spaces -------------

# The verb of an attribution line, anywhere in it: "Op … schreef Jan <jan@x>:" puts it in the
# middle, "El … escribió:" at the end. The line must end in a colon; it is certain when it
# also names a date, a time or an address (`ATTRIBUTION_EVIDENCE`), and counts only over
# quoted lines otherwise ("Bob Smith wrote:").
ATTRIBUTION_VERBS = _compile(
    [
        r"\bwrote\b",  # Gmail, Apple Mail, Thunderbird, Outlook (en)
        r"\bwrites\b",  # Mutt, Evolution (en)
        r"\ba écrit\b",  # Gmail, Apple Mail, Thunderbird (fr)
        r"\bschrieb\b",  # Gmail, Apple Mail, Thunderbird, GMX, web.de (de)
        r"\bgeschrieben\b",  # Open-Xchange, T-Online, 1&1 webmail (de: "hat am … geschrieben")
        r"\bschreef\b",  # Gmail, Apple Mail (nl)
        r"\bgeschreven\b",  # Outlook (nl: "heeft … geschreven")
        r"\bescribió\b",  # Gmail, Apple Mail (es)
        r"\bescreveu\b",  # Gmail, Apple Mail (pt, pt-br)
        r"\bha scritto\b",  # Gmail, Apple Mail, Thunderbird (it)
        r"\bscrisse\b",  # Libero, older clients (it)
        r"\bskrev\b",  # Gmail, Apple Mail (sv, da, no)
        r"\bkirjoitti\b",  # Gmail, Apple Mail (fi)
        r"\bnapisał(?:a|\(a\))?",  # Gmail, Apple Mail, Thunderbird (pl)
        r"\bpisze\b",  # Thunderbird, Onet, WP (pl)
        r"\bnapsal(?:a|\(a\))?",  # Gmail, Apple Mail, Seznam (cs)
        r"\bnapísal(?:a|\(a\))?",  # Gmail, Apple Mail (sk)
        r"\bnapisao\b|\bnapisala\b|\bje napisal\b",  # Gmail (hr, sr, sl)
        r"написал(?:а|\(а\))?",  # Gmail, Apple Mail, mail.ru, Yandex (ru)
        r"\bпишет\b",  # Yandex, Thunderbird (ru)
        r"написав(?:\(ла\))?|написала",  # Gmail (uk)
        r"\bпише\b",  # Gmail, ukr.net (uk)
        r"\bнаписа\b",  # Gmail (bg)
        r"\byazdı\b",  # Gmail, Apple Mail (tr)
        r"\bírta\b",  # Gmail, Apple Mail (hu)
        r"\ba scris\b",  # Gmail (ro)
        r"έγραψε",  # Gmail (el)
        r"\bva escriure\b",  # Gmail (ca)
        r"\brašė\b",  # Gmail (lt)
        r"\brakstīja\b",  # Gmail (lv)
        r"\bkirjutas\b",  # Gmail (et)
        r"כתב",  # Gmail (he)
        r"كتب",  # Gmail (ar)
        r"\bđã viết\b",  # Gmail (vi)
        r"\bmenulis\b",  # Gmail (id)
        r"写道|寫道",  # Gmail, QQ, NetEase (zh)
        r"님이 작성|작성:",  # Gmail, Apple Mail (ko)
        r"のメール[:：]",  # Apple Mail (ja)
    ]
)

# What makes a line that ends in a colon an attribution even without a verb, when it sits
# over quoted lines: Gmail's "2016-03-03 17:21 GMT+01:00 Bob <bob@x>:" form (locales without
# a translated sentence), its Japanese "2025年3月3日(月) 14:20 Bob <bob@x>:", and in general a
# mailbox written last ("… Bob <bob@x>:" or "(bob@x):"), which no sentence does.
ATTRIBUTION_FORMS = _compile(
    [
        r"^\d{4}-\d{1,2}-\d{1,2}\s+\d{1,2}:\d{2}\s+GMT[+-]\d{1,2}:?\d{2}\b.*:$",  # Gmail (many locales)
        r"^\d{4}/\d{1,2}/\d{1,2}\s.*<[^<>\s]+@[^<>\s]+>$",  # Gmail, older (zh, ja): "2013/10/2 Bob <bob@x>", no colon
        r"^\d{4}\s?年\s?\d{1,2}\s?月\s?\d{1,2}\s?日.*[:：]$",  # Gmail, Outlook (ja, zh)
        r"^\d{4}\s?년\s?\d{1,2}\s?월\s?\d{1,2}\s?일.*:$",  # Gmail (ko)
        r"^\*\s.*<[^<>\s]+@[^<>\s]+>\s*\[[^\]]*\d[^\]]*\]:$",  # Mutt (all locales): "* Bob <bob@x> [2025-03-03 14:20]:"
        r"\d{1,2}[:.]\d{2}.*[<(\[]\s*(?:mailto:)?[^\s<>()@]+@[^\s<>()@]+\s*[>)\]]\s*[:：]$",  # Gmail (ru, uk, ja …): date, time, then the mailbox
    ]
)

# A date, a time or an address: an attribution line names at least one of them.
ATTRIBUTION_EVIDENCE = re.compile(
    r"@|\d{1,2}[:.h]\d{2}|\d{1,4}[./-]\d{1,2}[./-]\d{1,4}|\b(?:19|20)\d{2}\b|\d{1,2}\s?[月日월일]"
)

# --- separator lines over a quoted message ("-----Original Message-----") -------------------

# The words between the dashes; decorations around them (``*``, ``_``, spaces) do not matter.
ORIGINAL_MESSAGE = _compile(
    [
        r"original message",  # Outlook, Thunderbird, Samsung Email, K-9 (en)
        r"original mail",  # GMX, web.de (en)
        r"reply message",  # Yahoo Mail apps, Mail.com (en)
        r"ursprüngliche nachricht",  # Outlook, Samsung Email (de)
        r"original-?nachricht",  # GMX, web.de, T-Online (de)
        r"mensaje original",  # Outlook, Samsung Email (es)
        r"message d'origine",  # Outlook (fr)
        r"message original",  # Samsung Email, Orange (fr)
        r"messaggio originale",  # Outlook, Samsung Email (it)
        r"oorspronkelijk bericht",  # Outlook (nl)
        r"origineel bericht",  # Samsung Email (nl)
        r"mensagem original",  # Outlook, Samsung Email (pt, pt-br)
        r"ursprungligt meddelande",  # Outlook (sv)
        r"originalmeddelande",  # Samsung Email (sv)
        r"oprindelig meddelelse",  # Outlook (da)
        r"opprinnelig melding",  # Outlook (no)
        r"alkuperäinen viesti",  # Outlook (fi)
        r"oryginalna wiadomość|wiadomość oryginalna",  # Outlook, Samsung Email (pl)
        r"původní zpráva",  # Outlook (cs)
        r"pôvodná správa",  # Outlook (sk)
        r"исходное сообщение|оригинальное сообщение",  # Outlook, Samsung Email (ru)
        r"вихідне повідомлення",  # Outlook (uk)
        r"eredeti üzenet",  # Outlook (hu)
        r"mesaj original",  # Outlook (ro)
        r"özgün ileti|orijinal mesaj",  # Outlook, Samsung Email (tr)
        r"αρχικό μήνυμα",  # Outlook (el)
        r"izvorna poruka|originalna poruka",  # Outlook (hr, sr)
        r"原始邮件|原始郵件",  # Outlook, Foxmail (zh)
        r"元のメッセージ",  # Outlook (ja)
        r"원본 메시지",  # Outlook (ko)
    ]
)

# --- the header block of a quoted message ("From: / Sent: / To: / Subject:") ------------------

# Labels the forward parser's tables lack: Outlook's in more languages (its "Sent" is often
# two words), and the East Asian clients'. Each is matched at the start of a line, before a
# colon (ASCII or full-width).
HEADER_FROM = _compile(
    [
        r"差出人",  # Outlook (ja)
        r"发件人|發件人|寄件者",  # Outlook, Foxmail (zh)
        r"보낸\s?사람",  # Outlook (ko)
        r"Από",  # Outlook (el)
        r"מאת",  # Outlook (he)
        r"Pošiljatelj|Pošiljalac",  # Outlook (hr, sr)
        r"Expéditeur",  # Orange, La Poste, Outlook (fr)
        r"Siuntėjas",  # Outlook (lt)
    ]
)
HEADER_OTHER = _compile(
    [
        r"Enviado el",  # Outlook (es)
        r"Enviada em|Enviado em|Data de envio",  # Outlook (pt, pt-br)
        r"Odesláno",  # Outlook (cs)
        r"Inviato il",  # Outlook (it, some builds)
        r"Envoyé le",  # Outlook for Mac (fr)
        r"Gesendet am",  # Outlook for Mac (de)
        r"Verzonden op",  # Outlook for Mac (nl)
        r"Ogg|Oggetto",  # Libero, Virgilio (it)
        r"Risposta",  # Outlook (it: Reply-To)
        r"Destinataire|Répondre à",  # Orange, La Poste, Outlook (fr)
        r"Beantwoorden - Aan",  # Outlook (nl: Reply-To)
        r"送信日時|宛先|件名|日付|CC",  # Outlook (ja)
        r"发送时间|發送時間|日期|收件人|收件者|主题|主旨|抄送|副本",  # Outlook, Foxmail (zh)
        r"보낸\s?날짜|받는\s?사람|제목|참조",  # Outlook (ko)
        r"Στάλθηκε|Ημερομηνία|Προς|Θέμα|Κοιν",  # Outlook (el)
        r"נשלח|אל|נושא",  # Outlook (he)
        r"Poslano|Šalji|Prima|Predmet",  # Outlook (hr)
        r"Išsiųsta|Kam|Tema",  # Outlook (lt)
    ]
)

# --- mobile and client signatures ("Sent from my iPhone") -------------------------------------

# A whole line, alone at the end of what someone wrote; a link after the words (Outlook's
# "Get Outlook for iOS<https://aka.ms/o0ukef>") does not matter.
MOBILE_SIGNATURES = _compile(
    [
        r"sent (?:from|via|with|using|on|by) .{0,50}",  # iOS, Android, Outlook, Yahoo, Proton, Spark (en)
        r"(?:\w+ )?from (?:my )?.{1,30}",  # hand-set mobile signatures (en): "From my iPhone 6", "Nik from mobile"
        r"(?:get|download) outlook for (?:ios|android|mac)",  # Outlook Mobile, Outlook for Mac (en)
        r"(?:envoyé|envoye) (?:de|depuis|à partir de|avec|via) .{0,50}",  # iOS, Android, Outlook (fr)
        r"obtenir outlook pour (?:ios|android)",  # Outlook Mobile (fr)
        r"(?:von|mit) mein(?:em|er)?(?:/mein(?:em|er)?)? .{0,50} gesendet",  # iOS, Samsung ("Von meinem/meiner Galaxy gesendet") (de)
        r"gesendet (?:von|mit|via) .{0,50}",  # Outlook, Android, GMX (de)
        r"outlook für (?:ios|android) (?:beziehen|herunterladen)",  # Outlook Mobile (de)
        r"diese nachricht wurde von .{0,60} gesendet\.?",  # GMX, web.de mail app (de)
        r"(?:enviado|enviada) (?:desde|con|a través de) .{0,50}",  # iOS, Android, Outlook (es)
        r"(?:obtener|descargar) outlook para (?:ios|android)",  # Outlook Mobile (es)
        r"(?:enviado|enviada) (?:do|de|pelo|a partir do|a partir de) .{0,50}",  # iOS, Android, Outlook (pt)
        r"(?:baixe|obter) o outlook para (?:ios|android)",  # Outlook Mobile (pt)
        r"inviato (?:da|dal|dal mio|con|tramite) .{0,50}",  # iOS, Android, Outlook (it)
        r"(?:scarica|ottieni) outlook per (?:ios|android)",  # Outlook Mobile (it)
        r"pobierz (?:aplikację )?outlook dla (?:systemu )?(?:ios|android)",  # Outlook Mobile (pl)
        r"skaffa outlook för (?:ios|android)",  # Outlook Mobile (sv)
        r"télécharger outlook pour (?:ios|android)",  # Outlook Mobile (fr)
        r"(?:verzonden|verstuurd) (?:vanaf|van|met|via) .{0,50}",  # iOS, Android, Outlook (nl)
        r"outlook voor (?:ios|android) downloaden",  # Outlook Mobile (nl)
        r"skickat från .{0,50}",  # iOS, Android (sv)
        r"sendt fra .{0,50}",  # iOS, Android (da, no)
        r"hent outlook til (?:ios|android)",  # Outlook Mobile (da, no)
        r"lähetetty .{0,50}",  # iOS ("Lähetetty iPhonesta"), Android (fi)
        r"wysłane z .{0,50}|wysłano z .{0,50}",  # iOS, Android (pl)
        r"odesláno z .{0,50}",  # iOS, Android (cs)
        r"odoslané z .{0,50}",  # iOS, Android (sk)
        r"отправлено (?:с|из) .{0,50}",  # iOS, Android (ru)
        r"надіслано з .{0,50}",  # iOS, Android (uk)
        r".{0,30}(?:'(?:u|ü|i|ı)mdan|'den|'dan) gönderildi",  # iOS, Android (tr)
        r"(?:elküldve|küldve) .{0,50}",  # iOS, Android (hu)
        r"trimis de pe .{0,50}",  # iOS, Android (ro)
        r"σταλθηκε από .{0,50}|στάλθηκε από .{0,50}",  # iOS, Android (el)
        r".{0,30}から送信",  # iOS, Android (ja)
        r"(?:发自|發自|来自|來自)我的.{0,30}",  # iOS, Android (zh)
        r"(?:从|從)我的.{0,30}(?:发送|傳送)",  # iOS (zh): "從我的 iPhone 傳送"
        r".{0,30}에서 보냄",  # iOS, Android (ko)
    ]
)

# A signature line counts only when it names a device or a mail app ("Sent from my iPhone",
# "Get Outlook for iOS"), not "Sent from the office".
MOBILE_DEVICES = re.compile(
    r"iphon|ipad|ipod|android|blackberry|galaxy|samsung|huawei|xiaomi|pixel|nokia|motorola|"
    r"oneplus|verizon|at&t|t-mobile|vodafone|outlook|yahoo|gmail|aol|proton|spark|airmail|newton|k-9|fairemail|bluemail|"
    r"thunderbird|gmx|web\.de|t-online|mail|mobil|móvil|movil|cellulare|telefon|телефон|"
    r"smartphone|phone|\bcell\b|tablet|handy|apple watch|watch|surface|windows|ios|appareil|dispositivo|"
    r"gerät|apparaat|laitteesta|puhelimesta|iphonesta|urządzenia|zařízení|устройства",
    re.I,
)

# Characters that show nothing and mean nothing in a reply: zero-width spaces and joiners that
# tracking and preview-text padding append, soft hyphens, the byte-order mark, bidi marks.
INVISIBLE = re.compile("[\u00ad\u034f\u180e\u200b\u200c\u200e\u200f\u2060-\u2064\ufeff]+")
# A zero-width joiner is kept inside emoji sequences; around spaces or alone it goes too.
LONE_JOINER = re.compile(r"(?<!\S)\u200d+|\u200d+(?!\S)")
