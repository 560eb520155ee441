"""Roles, token scopes and the permissions they grant: the single table everyone checks.

A person holds roles (Django groups). A token carries scopes. A request made with a personal
token may do what the person's roles allow AND the token's scopes allow; a service token has
no person, so its scopes alone decide. Some permissions are never granted to any token, so a
leaked token can neither mint more tokens nor manage people.
"""

from __future__ import annotations

VIEWER = "viewer"
ON_CALL = "on-call"
PLATFORM_LEAD = "platform-lead"
ADMIN = "admin"
ROLES = (VIEWER, ON_CALL, PLATFORM_LEAD, ADMIN)

# Permissions (what a service call needs).
READ = "read"
FLEET_MANAGE = "fleet.manage"  # regions, pools, pool models
JOBS = "jobs"  # start evidence jobs (benchmarks, shadow, evals...)
RAMP = "ramp"  # change split weights
DRAIN = "drain"  # drain / restore
APPROVE = "plan.approve"  # approve a stage gate
TOKENS_OWN = "tokens.own"  # create and revoke one's own personal tokens
ADMIN_MANAGE = "admin.manage"  # people, roles, service tokens

ALL_PERMISSIONS = frozenset(
    {READ, FLEET_MANAGE, JOBS, RAMP, DRAIN, APPROVE, TOKENS_OWN, ADMIN_MANAGE}
)

ROLE_PERMISSIONS: dict[str, frozenset[str]] = {
    VIEWER: frozenset({READ, TOKENS_OWN}),
    ON_CALL: frozenset({READ, TOKENS_OWN, DRAIN, RAMP, JOBS}),
    PLATFORM_LEAD: frozenset({READ, TOKENS_OWN, FLEET_MANAGE, JOBS, RAMP, DRAIN, APPROVE}),
    ADMIN: ALL_PERMISSIONS,
}

SCOPES = ("read", "jobs", "ramp", "drain", "fleet")
SCOPE_PERMISSIONS: dict[str, frozenset[str]] = {
    "read": frozenset({READ}),
    "jobs": frozenset({JOBS}),
    "ramp": frozenset({RAMP}),
    "drain": frozenset({DRAIN}),
    "fleet": frozenset({FLEET_MANAGE}),
}
NEVER_FOR_TOKENS = frozenset({TOKENS_OWN, ADMIN_MANAGE, APPROVE})


def permissions_for_roles(roles: set[str] | frozenset[str]) -> frozenset[str]:
    granted: set[str] = set()
    for role in roles:
        granted |= ROLE_PERMISSIONS.get(role, frozenset())
    return frozenset(granted)


def permissions_for_scopes(scopes: list[str] | tuple[str, ...]) -> frozenset[str]:
    granted: set[str] = set()
    for scope in scopes:
        granted |= SCOPE_PERMISSIONS.get(scope, frozenset())
    return frozenset(granted - NEVER_FOR_TOKENS)
