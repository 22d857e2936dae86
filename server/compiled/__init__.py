"""Compiled against eager: each compiled result judged against its node's eager answer
(design §3.3.18)."""
