"""The verifiable log: RFC 6962 Merkle hashing, C2SP signed notes, checkpoints,
cosignatures and proofs, the store's transparency log, receipts and a witness."""
