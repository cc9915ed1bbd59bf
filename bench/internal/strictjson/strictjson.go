// Package strictjson decodes the JSON a family stores (a suite's task
// file, its config) strictly: exactly one value and nothing after it, no
// unknown field, no key given twice in any object. encoding/json alone
// takes the last of two equal keys and ignores unknown fields; a stored
// definition that says one thing twice must be refused, not guessed at.
//
// It is pure and knows no family; families under bench use it.
package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Decode decodes data into v (a pointer) strictly; the error names what is
// wrong.
func Decode(data []byte, v any) error {
	if err := CheckKeys(data); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the JSON value")
	}
	return nil
}

// CheckKeys checks that data is one JSON value, nothing after it, in which
// no object gives a key twice. The error names the key and where it is
// ("$.papers[2].rubric").
func CheckKeys(data []byte) error {
	type frame struct {
		object  bool
		wantKey bool
		keys    map[string]bool
		path    string
		key     string // the current key, in an object
		index   int    // the next element's index, in an array
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var stack []*frame
	where := func() string {
		if len(stack) == 0 {
			return "$"
		}
		f := stack[len(stack)-1]
		if f.object {
			return f.path + "." + f.key
		}
		return fmt.Sprintf("%s[%d]", f.path, f.index)
	}
	valueDone := func() {
		if len(stack) == 0 {
			return
		}
		f := stack[len(stack)-1]
		if f.object {
			f.wantKey = true
		} else {
			f.index++
		}
	}
	seen := false
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			if !seen || len(stack) > 0 {
				return errors.New("not a complete JSON value")
			}
			return nil
		}
		if err != nil {
			return err
		}
		if len(stack) == 0 && seen {
			return errors.New("data after the JSON value")
		}
		seen = true
		if n := len(stack); n > 0 && stack[n-1].object && stack[n-1].wantKey {
			f := stack[n-1]
			if tok == json.Delim('}') {
				stack = stack[:n-1]
				valueDone()
				continue
			}
			key, _ := tok.(string)
			if f.keys[key] {
				return fmt.Errorf("%s: key %q given twice", f.path, key)
			}
			f.keys[key], f.key, f.wantKey = true, key, false
			continue
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{object: true, wantKey: true, keys: map[string]bool{}, path: where()})
		case json.Delim('['):
			stack = append(stack, &frame{path: where()})
		case json.Delim(']'):
			stack = stack[:len(stack)-1]
			valueDone()
		default:
			valueDone()
		}
	}
}
