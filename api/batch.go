package api

// MaxBatchCount is the most sandboxes one batch create may ask for.
const MaxBatchCount = 32768

// LabelBatch is the label every sandbox of a batch carries: the batch id.
const LabelBatch = "dsec.batch"

// BatchCreateRequest is the body of POST /v1/sandboxes:batch: Count
// sandboxes from one spec. The spec's fields sit beside "count".
type BatchCreateRequest struct {
	Count int `json:"count"`
	CreateSandboxRequest
}

// BatchItem is the outcome of one sandbox of a batch. ID is set whenever an
// id was given out (a sandbox whose node failed to build it has one, with
// state "failed"); Error is set when the item failed.
type BatchItem struct {
	Index int    `json:"index"`
	ID    string `json:"id,omitempty"`
	Node  string `json:"node,omitempty"`
	State string `json:"state"`
	Error *Error `json:"error,omitempty"`
}

// BatchResult is the answer to a batch create. Items are in index order;
// in a streamed batch they were sent as events and are left out here.
type BatchResult struct {
	Batch      string      `json:"batch"` // the value of the dsec.batch label
	Requested  int         `json:"requested"`
	Created    int         `json:"created"`
	Failed     int         `json:"failed"`
	DurationMs int64       `json:"duration_ms"`
	Items      []BatchItem `json:"items,omitempty"`
}

// BatchProgress counts a batch's items so far.
type BatchProgress struct {
	Total   int `json:"total"`
	Placed  int `json:"placed"`
	Created int `json:"created"`
	Failed  int `json:"failed"`
}

// BatchEvent is one line of a streamed batch create (Accept:
// application/x-ndjson). Exactly one field is set; the last event is
// Result or Error.
type BatchEvent struct {
	Progress *BatchProgress `json:"progress,omitempty"`
	Item     *BatchItem     `json:"item,omitempty"`
	Result   *BatchResult   `json:"result,omitempty"`
	Error    *Error         `json:"error,omitempty"`
}
