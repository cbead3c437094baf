"""Time to parse one mail (`parse_email`, what `gateway email parse` and the SMTP server run)
over the shared email corpus (`../shared/corpus/email`, read in place).

Every reply and forward body of the corpus (talon, zapier, mail-parser-reply, crisp) is
wrapped in a minimal text/plain mail; talon's .eml files are parsed as they are. Each round
parses all of them once; the figure is the median round's CPU time divided by the number of mails
(CPU time: other processes on the machine do not count).

    .venv/bin/python bench/email_parse.py              # 20 rounds
    .venv/bin/python bench/email_parse.py --rounds 50

Printed as one JSON object: `mails`, `rounds`, `us_per_mail` (median, best, worst round) for
the whole parse, and `reply_text_us_per_mail` for the reply-text extraction alone
(`strip_reply` on each text body), the part that depends on the quote patterns.
Exit code 2 when the corpus is absent.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from channels.email.parse import parse_email
from channels.email.quote import strip_reply

CORPUS = Path(__file__).resolve().parents[1] / ".." / "shared" / "corpus" / "email"
TEXT_FOLDERS = (
    "zapier-email-reply-parser/emails",
    "mail-parser-reply/emails",
    "crisp-email-forward-parser/fixtures",
)


def corpus_bodies(corpus: Path) -> list[str]:
    """The corpus's plain-text bodies."""
    return [
        path.read_text(encoding="utf-8", errors="replace")
        for folder in TEXT_FOLDERS
        for path in sorted((corpus / folder).glob("*.txt"))
        if not path.name.endswith("_subject.txt")
    ]


def corpus_mails(corpus: Path, bodies: list[str]) -> list[bytes]:
    """The corpus as raw mails: .eml files as they are, text bodies wrapped."""
    mails = [path.read_bytes() for path in sorted(corpus.rglob("*.eml"))]
    for body in bodies:
        message = EmailMessage()
        message["From"] = "Person <person@example.com>"
        message["To"] = "assistant@example.com"
        message["Subject"] = "Re: the question"
        message.set_content(body)
        mails.append(message.as_bytes())
    return mails


def per_item_us(items: list[Any], work: Callable[[Any], object], rounds: int) -> dict[str, float]:
    """CPU microseconds per item of `work` over `items`: median, best and worst round."""
    for item in items:  # warm-up: compiled patterns, imports
        work(item)
    figures = []
    for _ in range(rounds):
        started = time.process_time()
        for item in items:
            work(item)
        figures.append((time.process_time() - started) / len(items) * 1e6)
    return {
        "median": round(statistics.median(figures), 1),
        "best": round(min(figures), 1),
        "worst": round(max(figures), 1),
    }


def main() -> int:
    """Parse the corpus `--rounds` times and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    if not CORPUS.is_dir():
        print(f"no email corpus at {CORPUS}", file=sys.stderr)
        return 2
    bodies = corpus_bodies(CORPUS)
    mails = corpus_mails(CORPUS, bodies)
    result = {
        "mails": len(mails),
        "rounds": args.rounds,
        "us_per_mail": per_item_us(mails, parse_email, args.rounds),
        "reply_text_us_per_mail": per_item_us(bodies, strip_reply, args.rounds),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
