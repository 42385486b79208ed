"""Decoding: a request's proposer drafts, the target verifies in one batch, the longest valid
prefix is accepted and the rest rewound; the draft-length policy prices each step from the
stored costs. No llama.cpp here: the models are reached through small protocols."""
