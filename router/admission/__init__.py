"""Who may send a request and what it may spend: keys, budgets, rate limits, bounded slots, accounting."""
