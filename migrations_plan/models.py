# Plans, stages, gates, checks and approvals arrive with the plans issue.
