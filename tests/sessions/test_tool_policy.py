"""Who may use which tool: nothing unless a rule that applies allows it, a deny of any rule
that applies wins, rules apply by organization or user, by glob."""

from __future__ import annotations

import pytest

from sessions.tool_policy import PolicyRule, ToolPolicy

POLICY = ToolPolicy(
    (
        PolicyRule(orgs=("acme",), allow=("orders__lookup_order", "crm__*")),
        PolicyRule(users=("bob",), deny=("orders__*",)),
        PolicyRule(orgs=("globex-*",), allow=("*",), deny=("crm__delete_*",)),
        PolicyRule(users=("carol",), allow=("search__*",)),
    )
)


@pytest.mark.parametrize(
    ("org", "user", "tool", "allowed"),
    [
        ("acme", "alice", "orders__lookup_order", True),
        ("acme", "alice", "orders__cancel_order", False),  # not named by any allow
        ("acme", "alice", "crm__delete_contact", True),
        ("acme", "bob", "orders__lookup_order", False),  # the deny wins over the org's allow
        ("acme", "bob", "crm__lookup", True),
        ("initech", "bob", "crm__lookup", False),  # nothing allows bob outside acme
        ("globex-eu", "dave", "orders__anything", True),  # org glob, tool glob
        ("globex-eu", "dave", "crm__delete_contact", False),  # deny in the same rule
        ("globex", "dave", "orders__anything", False),  # "globex-*" needs the dash
        ("initech", "carol", "search__web", True),  # by user, whatever the org
        ("initech", "mallory", "search__web", False),  # no rule applies: nothing
        ("acme", "alice", "ORDERS__lookup_order", False),  # case-sensitive
    ],
)
def test_the_policy_allows_only_what_a_rule_allows_and_no_rule_denies(
    org: str, user: str, tool: str, allowed: bool
) -> None:
    assert POLICY.allows(org, user, tool) is allowed


def test_no_rules_allow_nothing() -> None:
    assert not ToolPolicy().allows("acme", "alice", "orders__lookup_order")


def test_the_order_of_the_rules_does_not_matter() -> None:
    reversed_policy = ToolPolicy(tuple(reversed(POLICY.rules)))
    for org, user, tool in [
        ("acme", "bob", "orders__lookup_order"),
        ("acme", "alice", "crm__x"),
        ("globex-1", "dave", "crm__delete_x"),
    ]:
        assert reversed_policy.allows(org, user, tool) == POLICY.allows(org, user, tool)
