// Package core is the coordinator's deterministic core: the life of every
// attempt and unit, from the moment an evaluation queues it to the moment
// its cross-check decides it, as a state machine over plain data.
//
// State.Step(now, event) applies one event (an announcement seen, a
// scheduling tick, a node's answer to an offer, a lease renewal, a report,
// a score, an evaluation asked for...) and returns Effects: the records to
// make durable, the offers to make once they are, the scoring jobs to run,
// and the answer to the event. It reads no clock (now is given), draws
// random numbers only from its own seeded generator, performs no I/O and
// starts no goroutine, so the same events in the same order always give
// the same state and effects: it is tested without libp2p, badger or a
// clock (etcd's raft is the model).
//
// The shell (package coordinator) owns everything else: the libp2p host
// and its streams, the journal that makes Effects.Records durable before
// anything is acted on, the capsule store, scoring workers that call the
// families, the HTTP API. It serialises calls to Step.
//
// Pure collaborators, used here and nowhere else in the lifecycle:
// coordinator/schedule (placement, fair share), coordinator/lease (leases
// and node allowances), coordinator/crosscheck (replication, canaries,
// node reliability), verify (the replay policy of model-driven attempts:
// replay.go schedules replays and applies their verdicts; the shell
// judges them). What the core knows of suites, agents and content it
// asks a Catalog (read-only lookups of plain data).
//
// It must not import libp2p, badger, the capsule store, net/http or any
// benchmark family.
package core
