package capsulestore

import "github.com/repronet/repronet/internal/schema"

// SchemaVersion is the version of the store's layout in a data folder
// (internal/schema): the index under the datastore's /blocks namespace and
// one file per block in DATA/blocks (internal/blockfs). Version 1 is the
// layout of every release so far; a folder that kept blocks in badger or
// in two-character shards is still version 1 (Open moves them).
const SchemaVersion = 1

// Schema is the store's part of a data folder's schema file: whoever
// opens a store in a data folder (node, coordinator, `repronet capsule`)
// passes it to schema.Open first.
func Schema() schema.Part {
	return schema.Part{Name: "capsulestore", Version: SchemaVersion}
}
