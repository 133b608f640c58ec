"""Quality in production: shadow escalation, agreement between tiers, live accuracy estimates and drift alarms."""
