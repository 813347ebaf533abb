package runtimecheck

import (
	"debug/dwarf"
	"debug/elf"
	"fmt"
	"sort"
)

// Layout is the struct layouts and symbol addresses of one executable,
// read from its DWARF and symbol table: what the compiler really did, for
// the toolchain that built it.
type Layout struct {
	structs map[string]map[string]int64 // type name -> field -> offset
	fields  map[string][]fieldAt        // type name -> fields by offset
	symbols map[string]uint64
}

type fieldAt struct {
	name   string
	offset int64
}

// ReadLayout reads the executable at path (a test binary: built with DWARF
// and a symbol table).
func ReadLayout(path string) (*Layout, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	d, err := f.DWARF()
	if err != nil {
		return nil, fmt.Errorf("%s has no DWARF (built with -ldflags=-w?): %w", path, err)
	}
	l := &Layout{structs: map[string]map[string]int64{}, fields: map[string][]fieldAt{}, symbols: map[string]uint64{}}
	r := d.Reader()
	for {
		e, err := r.Next()
		if err != nil {
			return nil, err
		}
		if e == nil {
			break
		}
		if e.Tag != dwarf.TagStructType || !e.Children {
			continue
		}
		name, _ := e.Val(dwarf.AttrName).(string)
		members := map[string]int64{}
		var order []fieldAt
		for {
			c, err := r.Next()
			if err != nil {
				return nil, err
			}
			if c == nil || c.Tag == 0 {
				break
			}
			if c.Tag != dwarf.TagMember {
				if c.Children {
					r.SkipChildren()
				}
				continue
			}
			fname, _ := c.Val(dwarf.AttrName).(string)
			off, ok := c.Val(dwarf.AttrDataMemberLoc).(int64)
			if !ok {
				continue
			}
			members[fname] = off
			order = append(order, fieldAt{fname, off})
		}
		if name != "" {
			if _, dup := l.structs[name]; !dup {
				l.structs[name] = members
				sort.SliceStable(order, func(i, j int) bool { return order[i].offset < order[j].offset })
				l.fields[name] = order
			}
		}
	}
	syms, err := f.Symbols()
	if err != nil {
		return nil, fmt.Errorf("%s has no symbol table (built with -ldflags=-s?): %w", path, err)
	}
	for _, s := range syms {
		l.symbols[s.Name] = s.Value
	}
	return l, nil
}

// Offset is the offset of field in the struct type named typ (DWARF names:
// "runtime.schedt", "internal/abi.MapType").
func (l *Layout) Offset(typ, field string) (int64, error) {
	members, ok := l.structs[typ]
	if !ok {
		return 0, fmt.Errorf("no struct type %s in this binary's DWARF", typ)
	}
	off, ok := members[field]
	if !ok {
		return 0, fmt.Errorf("struct %s has no field %s in this binary's DWARF", typ, field)
	}
	return off, nil
}

// FieldAt names the field of typ that starts at offset (or "" if none
// does): what a stale offset really touches.
func (l *Layout) FieldAt(typ string, offset int64) string {
	for _, f := range l.fields[typ] {
		if f.offset == offset {
			return f.name
		}
	}
	return ""
}

// Symbol is the link-time address of a symbol.
func (l *Layout) Symbol(name string) (uint64, bool) {
	a, ok := l.symbols[name]
	return a, ok
}
