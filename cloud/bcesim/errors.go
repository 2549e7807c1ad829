package bcesim

import (
	"fmt"
	"net/http"
)

// Error codes the simulator answers with. The first group is the exact strings
// the upstream IPAM (and our cloud package) classify; the second group is
// deliberately neutral so that no classifier substring ("is invalid",
// "BadRequest", "RateLimit", "NoSuchObject") appears where it does not belong.
const (
	CodeEniID               = "EniIdException"
	CodePrivateIPNotExist   = "PrivateIPNotExistException"
	CodeSubnetNoMoreIP      = "SubnetHasNoMoreIpException"
	CodeVMMemoryIPCap       = "VmMemoryCanNotAttachMoreIpException"
	CodePrivateIPInUse      = "PrivateIpInUseException"
	CodeNoSuchObject        = "NoSuchObject"
	CodeQuotaLimitExceeded  = "QuotaLimitExceeded"
	CodeRateLimit           = "RateLimit"
	CodeInternalError       = "InternalError"
	CodeSignatureMismatch   = "SignatureDoesNotMatch"
	CodeInvalidAuthHeader   = "InvalidHTTPAuthHeader"
	CodeInvalidAccessKeyID  = "InvalidAccessKeyId"
	CodeMalformedJSON       = "MalformedJSON"
	CodeInvalidURI          = "InvalidURI"
	CodeBadDigest           = "BadDigest"
	CodeInvalidParameter    = "InvalidParameterValue"
	CodeENIState            = "EniStatusConflict"
	CodeInstanceENICap      = "InstanceEniCapReached"
	CodeIPOutsideSubnet     = "PrivateIpOutOfSubnetRange"
	CodePrimaryIPRelease    = "PrimaryIpCanNotBeReleased"
	CodeVPCMismatch         = "VpcOrZoneMismatch"
	CodeMethodNotAllowed    = "MethodNotAllowed"
	CodeRequestBodyTooLarge = "RequestBodyTooLarge"
)

// APIError is an error the simulator returns to a client: an HTTP status plus
// the BCE error body. World-model methods return it so the HTTP layer can
// render it without guessing.
type APIError struct {
	Status  int
	Code    string
	Message string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message)
}

func apiErr(status int, code, format string, args ...any) *APIError {
	return &APIError{Status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}

func errBadParam(format string, args ...any) *APIError {
	return apiErr(http.StatusBadRequest, CodeInvalidParameter, format, args...)
}

func errENINotFound(id string) *APIError {
	// The real message is "The param eniId is invalid"; we keep the code exact but
	// word the message without "is invalid" so only the code drives classification.
	return apiErr(http.StatusBadRequest, CodeEniID, "eni %q does not exist", id)
}

func errNoSuchObject(kind, id string) *APIError {
	return apiErr(http.StatusNotFound, CodeNoSuchObject, "%s %q not found", kind, id)
}
