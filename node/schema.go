package node

import (
	"github.com/repronet/repronet/capsulestore"
	"github.com/repronet/repronet/internal/schema"
)

// SchemaVersion is the version of a node's records in its data folder
// (internal/schema: DATA/schema.json). Version 1: the layout of every
// release so far (a folder without the file is adopted as version 1).
const SchemaVersion = 1

// schemaParts are the parts of a node's data folder.
func schemaParts() []schema.Part {
	return []schema.Part{{Name: "node", Version: SchemaVersion}, capsulestore.Schema()}
}
