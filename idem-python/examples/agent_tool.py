"""An agent's tool made idempotent with the decorator.

An agent that times out, or a framework that retries a failed step, calls
its tools again with the same arguments. `send_email` below sends once per
key: the second call replays the first call's result instead of sending a
second email. The key comes from the agent's own identifiers (the run and
the tool call), so a retry of the same step reuses it.

    python agent_tool.py [STORE_URL]     # default: a SQLite file here
"""

from __future__ import annotations

import json
import sys

from idempotence import idempotent, open_store

store = open_store(sys.argv[1] if len(sys.argv) > 1 else "sqlite:agent-tools.db")
outbox: list = []  # stands in for the email provider


@idempotent(
    store,
    key=lambda run_id, call_id, to, subject, body: f"{run_id}:{call_id}",
    body=["to", "subject", "body"],
    namespace="agent-tools",
)
def send_email(run_id: str, call_id: str, to: str, subject: str, body: str) -> dict:
    """The tool the agent sees: sends one email and says what was sent."""
    outbox.append((to, subject))
    return {"sent": True, "message_id": f"msg-{len(outbox)}", "to": to}


def main() -> None:
    # The agent calls the tool, loses the answer (a timeout), and calls
    # it again with the same step's identifiers.
    step = dict(run_id="run-42", call_id="call-7", to="ada@example.com",
                subject="Your invoice", body="Attached.")
    first = send_email(**step)
    second = send_email(**step)
    print("first: ", json.dumps(first, sort_keys=True))
    print("second:", json.dumps(second, sort_keys=True))
    # Run it again: the agent restarted, the step is still answered and
    # this process sends nothing.
    print(f"emails sent by this process: {len(outbox)}")


if __name__ == "__main__":
    main()
