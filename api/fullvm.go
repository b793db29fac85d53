package api

// KindVM is the kind of a layer that is a whole disk image (qcow2 or
// raw) with its own kernel and init, which the fullvm backend boots.
const KindVM = "vm"
