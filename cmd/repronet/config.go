package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/repronet/repronet/gateway"
)

// A configuration file (`--config FILE`, TOML) holds what a daemon's flags
// hold: every top-level key is the name of one of the command's flags
// (`data = "/var/lib/repronet/coordinator"`, `listen = ["/ip4/…"]`, `slots
// = 4`), and a flag given on the command line wins over the file. A
// command may take tables beyond its flags (the coordinator's
// [[providers]], [[models]] and [limits], the model gateway's settings);
// any other key is an error naming it.

// configFlag is the name of the flag that names the configuration file.
const configFlag = "config"

// applyConfig reads the TOML file path and sets every flag of fs that the
// command line left unset from it. Keys named in tables are not flags:
// they are returned, decoded, for the caller. A relative path among the
// flags' values stays relative to the working folder, as on the command
// line.
func applyConfig(fs *flag.FlagSet, path string, tables ...string) (map[string]any, error) {
	if path == "" {
		return nil, nil
	}
	var doc map[string]any
	if _, err := toml.DecodeFile(path, &doc); err != nil {
		return nil, fmt.Errorf("--config %s: %w", path, err)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	extra := map[string]any{}
	keys := make([]string, 0, len(doc))
	for k := range doc {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var errs []error
	for _, k := range keys {
		v := doc[k]
		if slices.Contains(tables, k) {
			extra[k] = v
			continue
		}
		f := fs.Lookup(k)
		if f == nil || k == configFlag {
			errs = append(errs, fmt.Errorf("%q is not a setting of repronet %s (its settings are its flags' names%s)", k, fs.Name(), tableList(tables)))
			continue
		}
		if set[k] {
			continue
		}
		if err := setFlag(f, v); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", k, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("--config %s: %w", path, err)
	}
	return extra, nil
}

func tableList(tables []string) string {
	if len(tables) == 0 {
		return ""
	}
	return ", and the tables " + strings.Join(tables, ", ")
}

// setFlag sets f from a TOML value: strings, numbers, booleans and
// durations as they would be written on the command line; an array sets a
// repeatable flag once per element.
func setFlag(f *flag.Flag, v any) error {
	if list, ok := v.([]any); ok {
		if _, repeatable := f.Value.(*stringList); !repeatable {
			return fmt.Errorf("a list is given, but --%s takes one value", f.Name)
		}
		for _, e := range list {
			s, err := scalar(e)
			if err != nil {
				return err
			}
			if err := f.Value.Set(s); err != nil {
				return err
			}
		}
		return nil
	}
	s, err := scalar(v)
	if err != nil {
		return err
	}
	return f.Value.Set(s)
}

func scalar(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case bool:
		return strconv.FormatBool(x), nil
	case int64:
		return strconv.FormatInt(x, 10), nil
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64), nil
	default:
		return "", fmt.Errorf("a %T is not a flag's value (want a string, number or boolean)", v)
	}
}

// Tables of the coordinator's configuration that configure its model
// gateway, with the fields of the gateway's JSON configuration
// (docs/gateway.md).
var gatewayTables = []string{"providers", "models", "limits"}

// gatewayConfig builds the model gateway's configuration from the
// coordinator configuration's tables (nil when it has none): keys are read
// from key_file (relative to the configuration's folder) or key_env, and
// the whole is validated by the gateway's own validator.
func gatewayConfig(path string, tables map[string]any) (*gateway.Config, error) {
	if len(tables) == 0 {
		return nil, nil
	}
	b, err := json.Marshal(tables)
	if err != nil {
		return nil, fmt.Errorf("--config %s: %w", path, err)
	}
	c, err := gateway.ParseConfig(b, path, filepath.Dir(path), os.Getenv)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	if len(c.Models) == 0 {
		return nil, fmt.Errorf("--config %s: providers are configured but no [[models]]: agents could call nothing", path)
	}
	return &c, nil
}
