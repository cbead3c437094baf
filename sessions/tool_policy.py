"""Who may use which tool: the admins' allow/deny rules over ``server__tool`` names.

Nothing is allowed unless a rule that applies to the user allows it, and a deny of any rule
that applies wins over every allow. A rule applies to a user when the user's organization
matches one of its `orgs` globs or the user's id one of its `users` globs. Globs are
`fnmatch` patterns matched case-sensitively (``crm__*``, ``*``).
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase


def matches_any(name: str, globs: tuple[str, ...]) -> bool:
    """Whether `name` matches one of `globs`."""
    return any(fnmatchcase(name, glob) for glob in globs)


@dataclass(frozen=True, slots=True)
class PolicyRule:
    """One rule: for these organizations or users, allow or deny these tools."""

    orgs: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()

    def applies_to(self, org_id: str, user_id: str) -> bool:
        """Whether the rule speaks of this user (by organization or by id)."""
        return matches_any(org_id, self.orgs) or matches_any(user_id, self.users)


@dataclass(frozen=True, slots=True)
class ToolPolicy:
    """The rules, in the order the config lists them (the order does not change the answer)."""

    rules: tuple[PolicyRule, ...] = ()

    def allows(self, org_id: str, user_id: str, tool_name: str) -> bool:
        """Whether the user may use `tool_name` (``server__tool``)."""
        applying = [rule for rule in self.rules if rule.applies_to(org_id, user_id)]
        if any(matches_any(tool_name, rule.deny) for rule in applying):
            return False
        return any(matches_any(tool_name, rule.allow) for rule in applying)
