"""The sidekick (paper 3.3): host profiles sent to machines as content. A machine wants its
entitlement's profile (a free machine none); its desired state carries the profile merged from its
includes, with a content hash (documents.py), so profiles are edited in one place."""
