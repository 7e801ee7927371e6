"""Everything ``rlzoo train`` would reject at start-up, checked before anything heavy starts: the rule list, and what a resume may change."""
