"""The store as one process sees it: the directory view plugins get, checked reads, subscriptions."""
