// Package capsulestore owns repronet's content: content addressing, the
// swarm transfer, verification, the cache and safe extraction of capsule
// tarballs and agent image tarballs.
//
// A [Store] imports any file as a UnixFS file DAG with the Kubo
// `unixfs-v1-2025` profile (CIDv1, sha2-256, raw leaves, 1 MiB chunks,
// 1024 links per node, balanced layout), so the CID is the one `ipfs add`
// prints with that profile, into a blockstore over a go-datastore
// (go-ds-badger4 in production), or, with [WithBlockDir], into one file per
// block in a folder while the index stays in the datastore. It speaks bitswap on a libp2p host: boxo's
// bitswap server answers every peer from the blockstore, and the fetching
// side is the package's own (exchange.go, fetch.go): a [Store.Fetch] asks
// every connected peer and every provider hint which blocks it has and
// requests each block from one peer that has it, rarest first in a
// per-fetcher order, so that fetchers of one capsule trade blocks among
// themselves instead of all pulling from the seed. Every block is verified
// against its CID on arrival; a fetch times out on lack of progress, never
// on total duration, and resumes from what is stored. [Store.WriteTo]
// writes a fetched file's leaves only into the output file and serves them
// from there, re-verifying each it reads (placed.go).
//
// The store keeps an index of the files it holds (names, sizes, sha256, last
// use), which survives restarts; with a quota it evicts the least recently
// used files that are neither pinned nor in use ([Store.Acquire]).
// [Store.Verify] re-hashes every block and [Store.Repair] fetches corrupt or
// missing ones again. [Extract] unpacks a gzip'd tar into a directory and
// refuses anything that would create or change a file outside it.
// Subpackage origin downloads tarballs from their HTTP origin with resume.
//
// The package must not know about suites, levels, grading, scheduling or
// containerd: callers decide which CIDs to fetch, which peers to hint
// (there is no DHT: a coordinator knows who holds what), what is in use and
// what a workspace means. It keeps no global state and never changes boxo's
// process-wide import settings.
package capsulestore
