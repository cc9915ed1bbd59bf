package strictjson

import (
	"strings"
	"testing"
)

func TestDecode(t *testing.T) {
	type inner struct {
		A int `json:"a"`
	}
	type outer struct {
		X  string  `json:"x"`
		In []inner `json:"in"`
	}
	var o outer
	if err := Decode([]byte(`{"x": "y", "in": [{"a": 1}, {"a": 2}]}`), &o); err != nil || o.X != "y" || len(o.In) != 2 || o.In[1].A != 2 {
		t.Fatalf("%+v %v", o, err)
	}
	for _, tt := range []struct{ in, want string }{
		{`{"x": "y", "x": "z"}`, `$: key "x" given twice`},
		{`{"in": [{"a": 1}, {"a": 2, "a": 3}]}`, `$.in[1]: key "a" given twice`},
		{`{"in": [{"a": {"b": 1, "b": 2}}]}`, `$.in[0].a: key "b" given twice`},
		{`{"x": "y", "z": 1}`, `unknown field "z"`},
		{`{"x": "y"} {}`, `data after the JSON value`},
		{`{"x": "y"`, `not a complete JSON value`},
		{``, `not a complete JSON value`},
	} {
		var o outer
		if err := Decode([]byte(tt.in), &o); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %q", tt.in, err, tt.want)
		}
	}
	// Equal keys in different objects are fine.
	if err := CheckKeys([]byte(`[{"a": 1}, {"a": 2}, {"b": {"a": 3}, "a": [1, {"a": 4}]}]`)); err != nil {
		t.Error(err)
	}
}
