"""Bad input, fuzzed with hypothesis: web requests, Slack payloads, Teams activities, raw mail and
config files. Whatever arrives, the gateway answers without a 5xx, a crash or a hang, and every
refusal says why.

Each channel's tests share one whole gateway (SQLite in a temporary folder) started in an event
loop on a thread of its own (`harness.LoopThread`): a synchronous test runs an inner ``@given``
function whose examples hand their requests to that loop and wait for the answer, so hundreds of
examples cost one gateway start. After the examples the test checks that the gateway is still
healthy (`/healthz`, `/readyz`, its background loops running) and that the dispatcher finished
every accepted message without a failed turn (`Target.settle`). Examples are derandomized, so CI
runs the same ones every time.

Known bugs: a 5xx (or an exception) that a fuzz test runs into is a failure unless the input
belongs to a class listed in `harness.KNOWN_BUGS`; each class also has precise regression cases,
marked ``xfail(strict=True)`` while the id is listed. Fixing a bug means deleting its id: the
regression cases then must pass, and the fuzz tests stop tolerating that class.

The parts: `harness` (the loop thread, the gateway under test, known bugs, the hypothesis
settings), `strategies` (generic generators of hostile JSON and text), `conftest` (the loop
fixture), `slack_inputs` (Slack requests and their known-bug classes), and one test module per
input: `test_web`, `test_slack`, `test_teams`, `test_email`, `test_config_files`.
"""
