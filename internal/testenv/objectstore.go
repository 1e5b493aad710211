package testenv

import (
	"bytes"
	"context"
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// ObjectStore is an S3-compatible server (gofakes3, file-system backend)
// on a loopback port. Tests read it through the S3 API, as Velero does.
type ObjectStore struct {
	// URL is the server's endpoint (path-style buckets).
	URL string
	// Dir holds its buckets and their metadata.
	Dir string
}

// startObjectStore starts gofakes3 on a free loopback port with the bucket
// VeleroBucket created in a fresh folder.
func startObjectStore(bin, dir string) (*process, *ObjectStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, err
	}
	port, err := FreePort()
	if err != nil {
		return nil, nil, err
	}
	s := &ObjectStore{URL: fmt.Sprintf("http://127.0.0.1:%d", port), Dir: dir}
	cmd := exec.Command(bin, "-backend", "fs", "-fs.path", dir, "-fs.create", "-initialbucket", VeleroBucket,
		"-host", fmt.Sprintf("127.0.0.1:%d", port), "-quiet")
	proc, err := start("gofakes3", cmd, syscall.SIGKILL)
	if err != nil {
		return nil, nil, err
	}
	if err := proc.waitFor(20*time.Second, func() error { _, err := s.Keys(VeleroBucket, ""); return err }); err != nil {
		proc.stop(syscall.SIGKILL, time.Second)
		return nil, nil, err
	}
	return proc, s, nil
}

// listBucketResult is the part of S3's ListObjectsV2 answer read here.
type listBucketResult struct {
	Contents []struct {
		Key string `xml:"Key"`
	} `xml:"Contents"`
	IsTruncated           bool   `xml:"IsTruncated"`
	NextContinuationToken string `xml:"NextContinuationToken"`
}

// Keys lists the objects of the bucket whose key starts with prefix
// (ListObjectsV2, every page). Only objects count: folders are not objects.
func (s *ObjectStore) Keys(bucket, prefix string) ([]string, error) {
	var keys []string
	token := ""
	for {
		q := url.Values{"list-type": {"2"}, "prefix": {prefix}}
		if token != "" {
			q.Set("continuation-token", token)
		}
		page, err := s.list(bucket, q)
		if err != nil {
			return nil, err
		}
		for _, c := range page.Contents {
			keys = append(keys, c.Key)
		}
		if !page.IsTruncated || page.NextContinuationToken == "" {
			return keys, nil
		}
		token = page.NextContinuationToken
	}
}

func (s *ObjectStore) list(bucket string, q url.Values) (*listBucketResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/"+url.PathEscape(bucket)+"?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("list bucket %s: %w", bucket, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("list bucket %s: %s", bucket, resp.Status)
	}
	page := &listBucketResult{}
	if err := xml.NewDecoder(resp.Body).Decode(page); err != nil {
		return nil, fmt.Errorf("list bucket %s: %w", bucket, err)
	}
	return page, nil
}

// BackupFiles lists the objects Velero stored for a Backup
// (backups/<name>/ in its bucket).
func (v *Velero) BackupFiles(name string) ([]string, error) {
	return v.Store.Keys(VeleroBucket, "backups/"+name+"/")
}

// Get reads an object.
func (s *ObjectStore) Get(bucket, key string) ([]byte, error) {
	return s.do(http.MethodGet, bucket, key, nil)
}

// Put writes an object.
func (s *ObjectStore) Put(bucket, key string, data []byte) error {
	_, err := s.do(http.MethodPut, bucket, key, data)
	return err
}

func (s *ObjectStore) do(method, bucket, key string, body []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u := s.URL + "/" + url.PathEscape(bucket) + "/" + (&url.URL{Path: key}).EscapedPath()
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s/%s: %w", method, bucket, key, err)
	}
	defer func() { _ = resp.Body.Close() }()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s %s/%s: %s", method, bucket, key, resp.Status)
	}
	return out, nil
}
