package mount

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseMountinfo(t *testing.T) {
	tests := []struct {
		name    string
		line    string
		want    Info
		wantErr bool
	}{
		{
			name: "proc(5) example",
			line: "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue",
			want: Info{ID: 36, Parent: 35, Major: 98, Minor: 0, Root: "/mnt1", Mountpoint: "/mnt2",
				Options: "rw,noatime", Optional: []string{"master:1"}, FSType: "ext3", Source: "/dev/root",
				SuperOptions: "rw,errors=continue"},
		},
		{
			name: "no optional fields",
			line: "22 27 0:21 / /proc rw,relatime - proc proc rw",
			want: Info{ID: 22, Parent: 27, Major: 0, Minor: 21, Root: "/", Mountpoint: "/proc",
				Options: "rw,relatime", FSType: "proc", Source: "proc", SuperOptions: "rw"},
		},
		{
			name: "several optional fields",
			line: "40 22 0:35 / /a rw shared:5 master:3 propagate_from:2 - tmpfs tmpfs rw",
			want: Info{ID: 40, Parent: 22, Major: 0, Minor: 35, Root: "/", Mountpoint: "/a", Options: "rw",
				Optional: []string{"shared:5", "master:3", "propagate_from:2"}, FSType: "tmpfs", Source: "tmpfs",
				SuperOptions: "rw"},
		},
		{
			name: "octal escapes",
			line: `90 30 0:50 / /var/lib/dsec/layer\040mount\011tab\012nl\134bs ro,nosuid - erofs /img/a\040b.erofs ro,user_xattr`,
			want: Info{ID: 90, Parent: 30, Major: 0, Minor: 50, Root: "/", Mountpoint: "/var/lib/dsec/layer mount\ttab\nnl\\bs",
				Options: "ro,nosuid", FSType: "erofs", Source: "/img/a b.erofs", SuperOptions: "ro,user_xattr"},
		},
		{
			name: "backslash without octal kept",
			line: `91 30 0:51 / /x\y\04 rw - tmpfs none rw`,
			want: Info{ID: 91, Parent: 30, Major: 0, Minor: 51, Root: "/", Mountpoint: `/x\y\04`, Options: "rw",
				FSType: "tmpfs", Source: "none", SuperOptions: "rw"},
		},
		{name: "no separator", line: "36 35 98:0 /mnt1 /mnt2 rw,noatime ext3 /dev/root rw", wantErr: true},
		{name: "too short", line: "36 35 98:0 /", wantErr: true},
		{name: "bad id", line: "x 35 98:0 / /m rw - ext3 /dev/root rw", wantErr: true},
		{name: "bad device", line: "36 35 98 / /m rw - ext3 /dev/root rw", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseMountinfo(strings.NewReader(tt.line + "\n"))
			if tt.wantErr {
				if err == nil {
					t.Errorf("parsed %+v, want an error", got)
				}
				return
			}
			if err != nil || len(got) != 1 || !reflect.DeepEqual(got[0], tt.want) {
				t.Errorf("parse = %+v, %v\nwant %+v", got, err, tt.want)
			}
		})
	}
}

func TestMountinfoOfThisProcess(t *testing.T) {
	infos, err := Mountinfo()
	if err != nil {
		t.Fatal(err)
	}
	var root bool
	for _, m := range infos {
		root = root || m.Mountpoint == "/"
	}
	if !root {
		t.Errorf("no mount at / among %d mounts", len(infos))
	}
}
