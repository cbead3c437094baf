"""Time to parse one mail (`parse_email`, what `gateway email parse` and the SMTP server run)
over the shared email corpus (`../shared/corpus/email`, read in place).

Every reply and forward body of the corpus (talon, zapier, mail-parser-reply, crisp) is
wrapped in a minimal text/plain mail; talon's .eml files are parsed as they are. Each round
parses all of them once; the figure is the median round divided by the number of mails.

    .venv/bin/python bench/email_parse.py              # 20 rounds
    .venv/bin/python bench/email_parse.py --rounds 50

Printed as one JSON object: `mails`, `rounds`, `us_per_mail` (median, best, worst round).
Exit code 2 when the corpus is absent.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from email.message import EmailMessage
from pathlib import Path

from channels.email.parse import parse_email

CORPUS = Path(__file__).resolve().parents[1] / ".." / "shared" / "corpus" / "email"
TEXT_FOLDERS = (
    "zapier-email-reply-parser/emails",
    "mail-parser-reply/emails",
    "crisp-email-forward-parser/fixtures",
)


def corpus_mails(corpus: Path) -> list[bytes]:
    """The corpus as raw mails: .eml files as they are, text bodies wrapped."""
    mails = [path.read_bytes() for path in sorted(corpus.rglob("*.eml"))]
    for folder in TEXT_FOLDERS:
        for path in sorted((corpus / folder).glob("*.txt")):
            if path.name.endswith("_subject.txt"):
                continue
            message = EmailMessage()
            message["From"] = "Person <person@example.com>"
            message["To"] = "assistant@example.com"
            message["Subject"] = "Re: the question"
            message.set_content(path.read_text(encoding="utf-8", errors="replace"))
            mails.append(message.as_bytes())
    return mails


def main() -> int:
    """Parse the corpus `--rounds` times and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    if not CORPUS.is_dir():
        print(f"no email corpus at {CORPUS}", file=sys.stderr)
        return 2
    mails = corpus_mails(CORPUS)
    for data in mails:  # warm-up: compiled patterns, imports
        parse_email(data)
    rounds = []
    for _ in range(args.rounds):
        started = time.perf_counter()
        for data in mails:
            parse_email(data)
        rounds.append((time.perf_counter() - started) / len(mails) * 1e6)
    print(
        json.dumps(
            {
                "mails": len(mails),
                "rounds": args.rounds,
                "us_per_mail": {
                    "median": round(statistics.median(rounds), 1),
                    "best": round(min(rounds), 1),
                    "worst": round(max(rounds), 1),
                },
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
