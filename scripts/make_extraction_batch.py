#!/usr/bin/env python3
"""Writes scripts/extraction_batch.jsonl: 40 extraction requests in OpenAI's batch form (issue 26).

Each line asks a chat model to copy the fields of a short text (a contact card, an order, an
event, a product listing, a bug report) into JSON under a strict `json_schema` response format:
what scripted extraction looks like. Five schema shapes cover strings, integers, booleans, enums,
arrays of strings and a nested object, using only keywords llama-cpp-python's JSON schema
converter implements (llamaspec/runtime/grammar.py refuses the others: no minimum, maximum, ...).
The values are in the text, so copying them is the natural answer even for SmolLM2-135M.

    .venv/bin/python scripts/make_extraction_batch.py            # rewrites the file
    .venv/bin/python scripts/make_extraction_batch.py --check    # exit 1 if the file is stale
    .venv/bin/python scripts/make_extraction_batch.py --no-example   # extraction_batch_no_example.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "extraction_batch.jsonl"
OUT_NO_EXAMPLE = OUT.with_name("extraction_batch_no_example.jsonl")
MAX_TOKENS = 160
SYSTEM = "You extract information from text. Answer with one JSON object and nothing else."


def _obj(props: dict) -> dict:
    """A strict object: every property required, nothing else allowed (what OpenAI's strict mode needs)."""
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


S, I, B = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}
LIST = {"type": "array", "items": {"type": "string"}}

SCHEMAS = {
    "contact": _obj({"name": S, "email": S, "phone": S, "company": S, "job_title": S}),
    "order": _obj({"order_id": S, "customer": S, "items": LIST, "quantity": I,
                   "status": {"type": "string", "enum": ["pending", "shipped", "delivered", "cancelled"]},
                   "paid": B}),
    "event": _obj({"title": S, "date": S, "city": S, "speakers": LIST, "online": B}),
    "product": _obj({"name": S, "brand": S, "category": {"type": "string", "enum":
                     ["electronics", "kitchen", "clothing", "books", "garden", "toys"]},
                     "price": {"type": "number"}, "in_stock": B}),
    "bug": _obj({"title": S, "severity": {"type": "string", "enum": ["low", "medium", "high", "critical"]},
                 "component": S, "version": S, "reporter": _obj({"name": S, "email": S})}),
}

ASK = {
    "contact": "Extract the contact details (name, email, phone, company, job_title) from this email signature.",
    "order": "Extract the order (order_id, customer, items, quantity, status, paid) from this message.",
    "event": "Extract the event (title, date, city, speakers, online) from this announcement.",
    "product": "Extract the product (name, brand, category, price, in_stock) from this listing.",
    "bug": "Extract the bug report (title, severity, component, version, reporter with name and email) "
           "from this ticket.",
}

TEXTS = {
    "contact": [
        "Best regards,\nMaria Lopez\nSenior Accountant, Brightwater Logistics\nmaria.lopez@brightwater.com\n+1 415 555 0142",
        "Thanks!\n-- \nTom Becker | Head of Sales | Kessler Tools GmbH\nPhone: +49 30 1234 5678\nEmail: t.becker@kessler-tools.de",
        "Yuki Tanaka\nData Engineer\nOrbit Analytics Inc.\nyuki.tanaka@orbitanalytics.io / +81 3 5555 0199",
        "Cheers, Liam O'Connor (Product Manager at Greenleaf Foods). Call me on +353 1 555 0178 or write to "
        "liam@greenleaffoods.ie.",
        "Sophie Martin - Office Manager - Atelier Bleu SARL - sophie.martin@atelierbleu.fr - +33 1 55 55 01 23",
        "Regards,\nDr. Ahmed Karim\nResearch Scientist\nNile BioLabs\nahmed.karim@nilebiolabs.com\nTel. +20 2 5555 0456",
        "Sent from my phone. Anna Kowalski, Software Developer, Pixel Forge Studio, anna.k@pixelforge.pl, "
        "+48 22 555 0789",
        "Kind regards,\nCarlos Silva\nStore Manager\nSol Nascente Supermercados\ncarlos.silva@solnascente.pt\n+351 21 555 0133",
    ],
    "order": [
        "Hi, order A-10234 for Jane Doe: 2 items, a blue ceramic mug and a bamboo tray. It has shipped and "
        "the card payment went through.",
        "Order B-55821 (customer: Peter Novak) is still pending. He ordered 3 items: a desk lamp, an HDMI "
        "cable and a mouse pad. Not paid yet, invoice sent.",
        "Your order C-00917, Mr. Ali Hassan, was delivered today: 1 item, a leather wallet. Paid by PayPal.",
        "Customer Emma Schmidt cancelled order D-31177 (4 items: running shoes, socks, a water bottle and a "
        "cap) before payment.",
        "Order E-72040 for Lucas Moreau has shipped: 2 items, a French press and a coffee grinder. Payment "
        "received.",
        "Pending order F-11890: customer Chen Wei, 5 items (notebook, pencil case, eraser, ruler, stapler). "
        "Payment not received yet.",
        "Order G-40415 for Olivia Brown was delivered on Monday: 1 item, a garden hose. It was paid in full.",
        "Hello Sara Ahmed, order H-66302 (2 items: yoga mat, foam roller) has shipped. We have not received "
        "your payment.",
    ],
    "event": [
        "Join us for the Python Data Summit on 2025-06-12 in Berlin. Talks by Ines Weber and Marco Rossi. "
        "In person only.",
        "The Rust Meetup Spring Edition takes place online on 2025-04-03, with speakers Ken Adams and Priya "
        "Nair. Link follows by email.",
        "Open Source Day 2025: 2025-09-20 in Lisbon, with talks from Joao Costa, Eva Lindqvist and Omar Farouk. "
        "Venue only, no stream.",
        "Webinar: Cloud Costs Explained, 2025-02-18, hosted online by Laura Chen. Register now!",
        "The Nordic AI Forum is held in Oslo on 2025-11-05. Keynotes: Henrik Dahl and Sara Berg. Tickets at "
        "the door, not streamed.",
        "Frontend Friday, 2025-03-14, Amsterdam: Tim de Vries and Noor Bakker speak about CSS. In person.",
        "Security Week kickoff on 2025-10-01 in Vienna with Klaus Huber. Also streamed online for remote "
        "attendees.",
        "The Green Energy Talks come to Madrid on 2025-05-22, with Lucia Fernandez and Pablo Ruiz. Attend "
        "in person only.",
    ],
    "product": [
        "Aurora X2 wireless headphones by Soundwave, 89.99 USD. Category: electronics. In stock, ships today.",
        "Chef's Pro 8-inch knife from Kitchenmaster, kitchen, 45.50 EUR. Currently out of stock.",
        "The Trail Runner jacket by Northpeak, clothing, 129.00 USD, available now.",
        "Book: The Quiet Garden, published by Meadow Press, books section, 18.75 USD. In stock.",
        "GrowMax 20 L potting soil from Terra Verde, garden, 12.40 EUR. Sold out.",
        "Robo Rex building kit by Blockworks, toys, 59.95 USD. In stock, 12 left.",
        "SmartPlug Mini from Homelink, electronics, 24.99 USD, out of stock until May.",
        "Cast iron skillet 28 cm by Ironforge, kitchen, 39.00 EUR. Available, ships in 2 days.",
    ],
    "bug": [
        "Title: Login button does nothing on Safari. Severity: high. Component: web-auth. Version 2.4.1. "
        "Reported by Nina Patel (nina.patel@example.com).",
        "Crash when exporting PDF with images. This is critical, it loses data. Component: export. App "
        "version 5.0.2. Reporter: Jakob Meier, jakob.meier@example.org",
        "Title: Typo in settings page footer. Severity: low. Component: ui-settings. Version 1.9.0. Reported by "
        "Grace Kim (grace.kim@example.net).",
        "Search results are slow for long queries (medium severity) in component search-api, version 3.2.0. "
        "Reported by Omar Haddad, omar.haddad@example.com.",
        "Title: Notifications arrive twice. Severity: medium. Component: notifications. Version: 4.1.3. "
        "Reporter: Elena Petrova (elena.petrova@example.com)",
        "Database migration fails on upgrade, critical. Component: db-migrate, version 7.0.0. Reported by "
        "Samuel Okafor, samuel.okafor@example.org.",
        "Dark mode colors wrong in charts. Severity: low. Component: charts. Version 2.2.5. Reporter Lea "
        "Fischer, lea.fischer@example.de",
        "Title: Upload stops at 99 percent. Severity: high. Component: file-upload. Version 6.3.1. Reported "
        "by Daniel Reyes (daniel.reyes@example.com).",
    ],
}


# one worked example per kind (a prior user/assistant turn): few-shot extraction, as scripts do it;
# it shows a 135M model the compact form and short arrays, and the keys it will copy
EXAMPLES = {
    "contact": ("Best,\nJohn Smith\nMarketing Lead, Bluebird Media\njohn.smith@bluebird.com\n+1 212 555 0100",
                {"name": "John Smith", "email": "john.smith@bluebird.com", "phone": "+1 212 555 0100",
                 "company": "Bluebird Media", "job_title": "Marketing Lead"}),
    "order": ("Order Z-99001 for Mark Lee has been delivered: 2 items, a teapot and a tea towel. Paid by card.",
              {"order_id": "Z-99001", "customer": "Mark Lee", "items": ["teapot", "tea towel"], "quantity": 2,
               "status": "delivered", "paid": True}),
    "event": ("The Go Conference is on 2025-01-09 in Prague, with talks by Jana Novak and Ravi Shah. Also online.",
              {"title": "Go Conference", "date": "2025-01-09", "city": "Prague", "speakers": ["Jana Novak", "Ravi Shah"],
               "online": True}),
    "product": ("Breeze 300 desk fan by Coolair, electronics, 34.90 USD. Out of stock.",
                {"name": "Breeze 300 desk fan", "brand": "Coolair", "category": "electronics", "price": 34.9,
                 "in_stock": False}),
    "bug": ("Title: Page freezes on scroll. Severity: medium. Component: viewer. Version 1.0.4. Reported by "
            "Ben Clark (ben.clark@example.com).",
            {"title": "Page freezes on scroll", "severity": "medium", "component": "viewer", "version": "1.0.4",
             "reporter": {"name": "Ben Clark", "email": "ben.clark@example.com"}}),
}


def lines(worked_example: bool = True) -> list[dict]:
    """The 40 requests, kinds interleaved (contact-0, order-0, event-0, ..., bug-7); each with a
    worked example of its kind before it (a user turn and the answer), or without."""
    out = []
    for i in range(8):
        for kind, schema in SCHEMAS.items():
            example, answer = EXAMPLES[kind]
            shown = [{"role": "user", "content": f"{ASK[kind]}\n\n{example}"},
                     {"role": "assistant", "content": json.dumps(answer)}] if worked_example else []
            body = {"model": "extract", "messages": [
                {"role": "system", "content": SYSTEM}, *shown,
                {"role": "user", "content": f"{ASK[kind]}\n\n{TEXTS[kind][i]}"}],
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": kind, "schema": schema, "strict": True}},
                "max_tokens": MAX_TOKENS, "temperature": 0}
            out.append({"custom_id": f"{kind}-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})
    return out


def render(worked_example: bool = True) -> str:
    return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines(worked_example))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only check that the file is up to date")
    ap.add_argument("--no-example", action="store_true",
                    help=f"the same requests without the worked example (default output: {OUT_NO_EXAMPLE.name})")
    ap.add_argument("-o", "--output", type=Path)
    a = ap.parse_args()
    a.output = a.output or (OUT_NO_EXAMPLE if a.no_example else OUT)
    text = render(not a.no_example)
    if a.check:
        same = a.output.is_file() and a.output.read_text() == text
        print(f"{a.output}: {'up to date' if same else 'stale: run scripts/make_extraction_batch.py'}")
        return 0 if same else 1
    a.output.write_text(text)
    print(f"{a.output}: {text.count(chr(10))} requests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
